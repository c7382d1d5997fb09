"""The talkers: the thinker's text stream in, speech out as soon as each clause is complete.

``clause_splitter`` cuts the text into clauses (the first one short) and ``clause_stream`` is the shell both
talkers share (clauses of all sessions earliest-due first). ``piper`` speaks each clause with Piper (CPU
preset); ``speech_prompts`` writes each as an Orpheus prompt for the codec LM (GPU preset), whose codes the
vocoder stage (``omni_rt.stages.vocoder``) turns into audio.
"""
