"""Function calling shared by every engine: ``schema`` (tool definitions and ``tool_choice``), ``prompt`` (tools
rendered into the prompt), ``parser`` (calls parsed out of the streamed text), ``grammar`` (the JSON-schema
grammar a forced call decodes under).
"""
