// omni-rt browser voice demo, over WebRTC by default and WebSocket as the fallback.
//
// WebRTC (OpenAI's WebRTC flow): the microphone track and the answer's track are
// Opus; events travel on the data channel `oai-events`; the offer is POSTed to
// /v1/realtime/calls. The server paces the audio, clears it on barge-in and
// truncates the item to what was played. When WebRTC does not connect (no
// answer, ICE fails, timeout) the page falls back to the WebSocket.
//
// WebSocket: microphone -> AudioWorklet (24 kHz PCM16) -> `input_audio_buffer.append`
// on WS /v1/realtime; `response.output_audio.delta` -> AudioWorklet jitter buffer
// -> speakers. Barge-in flushes playback at once and truncates the interrupted
// item where the user stopped hearing it.
//
// No build step and no external resources. State for tests: window.omniStats.

const RATE = 24000; // wire format: audio/pcm, 24 kHz, mono, PCM16 little-endian
const CHUNK_MS = 20; // microphone chunk per append
const PREBUFFER_MS = 80; // jitter buffer before playback starts
const REBUFFER_MS = 40; // after an underrun
const RTC_CONNECT_TIMEOUT_MS = 10000; // offer posted -> data channel open, else fall back to WebSocket
const SOUND_RMS = 0.01; // a 20 ms chunk of the answer's track louder than this is sound
const RECORD_LIMIT_CHUNKS = 50 * 60; // ?record=1 keeps the first minute of received audio (tests)

const SESSION_UPDATE = {
  type: 'session.update',
  session: {
    type: 'realtime',
    output_modalities: ['audio'],
    audio: {
      input: {
        format: { type: 'audio/pcm', rate: RATE },
        turn_detection: {
          type: 'server_vad',
          silence_duration_ms: 500,
          create_response: true,
          interrupt_response: true,
        },
        transcription: { model: 'whisper-1' },
      },
      output: { format: { type: 'audio/pcm', rate: RATE } },
    },
  },
};

const CLOSE_REASONS = {
  1000: 'Connection closed',
  1001: 'Server is going away',
  1006: 'Connection lost',
  1008: 'Not authorized — check the API token',
  1009: 'Message too large',
  1011: 'Server error',
  1012: 'Server is restarting',
  1013: 'Server is full — try again later',
};

const $ = (id) => document.getElementById(id);
const ui = {
  connect: $('connect'),
  mute: $('mute'),
  token: $('token'),
  status: $('status'),
  latency: $('latency'),
  latencyDetail: $('latency-detail'),
  log: $('log'),
  level: $('level'),
  activity: $('activity'),
  details: $('details'),
  transport: $('transport'),
  liveTransport: $('live-transport'),
  remoteAudio: $('remote-audio'),
};

const stats = {
  state: 'idle', // idle | connecting | connected | closed | error
  playedSamples: 0, // response audio actually output, in 24 kHz samples
  latencies: [], // ms, end of speech -> first sound, one per turn
  serverLatencies: [], // ms, as reported by the server, when it does
  userTranscripts: [],
  assistantTranscripts: [],
  errors: [], // server `error` events and client-side failures
  sent: {}, // client event type -> count
  received: {}, // server event type -> count
  underruns: 0,
  micChunks: 0, // 20 ms chunks captured
  truncations: [], // {item_id, audio_end_ms}
  closeCode: null,
  closeReason: '',
  sessionId: null,
  transport: null, // the transport in use: 'webrtc' | 'websocket'
  fallbacks: [], // why WebRTC was given up for WebSocket
  callId: null,
  cleared: 0, // output_audio_buffer.cleared events (WebRTC barge-in)
};
window.omniStats = stats;
window.omniRecorded = []; // Int16Array chunks of the answer's track (24 kHz), with ?record=1

// ---------------------------------------------------------------- helpers

function bytesToBase64(u8) {
  let s = '';
  for (let i = 0; i < u8.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function base64ToFloat32(b64) {
  const bin = atob(b64);
  const n = bin.length >> 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 32768;
  }
  return out;
}

// Linear resampling, only used if the browser refused a 24 kHz AudioContext.
function resampleLinear(x, from, to) {
  if (from === to) return x;
  const n = Math.max(1, Math.round((x.length * to) / from));
  const y = new Float32Array(n);
  const step = from / to;
  for (let i = 0; i < n; i++) {
    const t = i * step;
    const j = Math.min(x.length - 1, t | 0);
    const f = t - j;
    y[i] = x[j] * (1 - f) + x[Math.min(x.length - 1, j + 1)] * f;
  }
  return y;
}

function realtimeUrl(token) {
  const params = new URLSearchParams(location.search);
  // ?ws=ws://host:port/v1/realtime points the page at another server.
  let url = params.get('ws');
  if (!url) {
    // The page loads as /static/app.js (index at /): the endpoint is a sibling of static/.
    const u = new URL('../v1/realtime', import.meta.url);
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    url = u.href;
  }
  const u = new URL(url, location.href);
  if (token) u.searchParams.set('token', token);
  return u;
}

function liveUrl(token) {
  // ?live=ws://host:port/v1/live/sessions points the page's GPT-Live mode at another server.
  let url = new URLSearchParams(location.search).get('live');
  if (!url) {
    const u = new URL('../v1/live/sessions', import.meta.url);
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    url = u.href;
  }
  const u = new URL(url, location.href);
  if (token) u.searchParams.set('token', token);
  return u;
}

function callsUrl() {
  // ?calls=http://host:port/v1/realtime/calls points the page at another server.
  const given = new URLSearchParams(location.search).get('calls');
  return new URL(given || new URL('../v1/realtime/calls', import.meta.url).href, location.href);
}

function showTransport(kind, phase) {
  const name = kind === 'webrtc' ? 'WebRTC' : kind === 'live' ? 'GPT-Live' : 'WebSocket';
  ui.liveTransport.textContent = phase === 'live' ? `${name} live` : phase === 'connecting' ? `${name}…` : '';
  ui.liveTransport.dataset.kind = phase === 'live' ? (kind === 'live' ? 'websocket' : kind) : '';
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

// ---------------------------------------------------------------- UI

function setState(state, text) {
  stats.state = state;
  ui.status.dataset.state = state === 'closed' ? 'idle' : state;
  if (text !== undefined) ui.status.textContent = text;
  const live = state === 'connecting' || state === 'connected';
  ui.connect.textContent = state === 'connecting' ? 'Cancel' : live ? 'Disconnect' : 'Connect';
  ui.connect.classList.toggle('live', live);
  ui.connect.setAttribute('aria-label', live ? 'Disconnect' : 'Connect');
  ui.mute.disabled = state !== 'connected';
  ui.token.disabled = live;
  ui.transport.disabled = live;
  if (!live) {
    showTransport(null, '');
    ui.mute.setAttribute('aria-pressed', 'false');
    ui.mute.textContent = 'Mute';
    ui.level.style.width = '0';
    ui.activity.textContent = '';
  }
}

function scrollLog() {
  ui.log.scrollTop = ui.log.scrollHeight;
}

function note(text, isError = false) {
  const el = document.createElement('div');
  el.className = isError ? 'note error' : 'note';
  el.textContent = text;
  ui.log.appendChild(el);
  scrollLog();
  return el;
}

const bubbles = new Map(); // item id -> {el, text, role}

function bubble(itemId, role) {
  let b = bubbles.get(itemId);
  if (b) return b;
  const el = document.createElement('div');
  el.className = `msg ${role} pending`;
  el.dataset.itemId = itemId;
  const who = document.createElement('span');
  who.className = 'who';
  who.textContent = role === 'user' ? 'You' : 'Assistant';
  const chip = document.createElement('span');
  chip.className = 'chip';
  who.appendChild(chip);
  const text = document.createElement('span');
  text.className = 'text';
  text.textContent = role === 'user' ? 'listening…' : '…';
  el.append(who, text);
  ui.log.appendChild(el);
  b = { el, textEl: text, chip, text: '', role };
  bubbles.set(itemId, b);
  scrollLog();
  return b;
}

function setBubbleText(b, text, final = false) {
  b.text = text;
  b.textEl.textContent = text || (final ? '(no speech recognized)' : '…');
  b.el.classList.toggle('pending', !text);
  scrollLog();
}

function showLatency(ms, itemId) {
  stats.latencies.push(ms);
  ui.latency.textContent = `${Math.round(ms)} ms`;
  const n = stats.latencies.length;
  let detail = `last turn · median ${Math.round(median(stats.latencies))} ms over ${n} turn${n > 1 ? 's' : ''}`;
  if (stats.serverLatencies.length) {
    detail += ` · server TTFA ${Math.round(stats.serverLatencies[stats.serverLatencies.length - 1])} ms`;
  }
  ui.latencyDetail.textContent = detail;
  const b = bubbles.get(itemId);
  if (b) b.chip.textContent = `${Math.round(ms)} ms`;
}

function serverLatencyFrom(response) {
  // Optional: a server may report its own end-of-turn -> first audio time.
  const md = (response && response.metadata) || {};
  for (const key of ['ttfa_ms', 'server_ttfa_ms', 'latency_ms']) {
    const v = parseFloat(md[key]);
    if (Number.isFinite(v)) return v;
  }
  return null;
}

// ---------------------------------------------------------------- session

let session = null;

class Session {
  constructor(token) {
    this.token = token;
    this.ws = null;
    this.opened = false;
    this.closed = false;
    this.muted = false;
    this.stream = null;
    this.captureCtx = null;
    this.playCtx = null;
    this.captureNode = null;
    this.playNode = null;
    this.playRatio = 1; // 24 kHz samples per playback-context sample
    this.items = new Map(); // assistant item id -> {responseId, received, played, audioDone}
    this.dropItems = new Set(); // items whose further audio is discarded (barge-in)
    this.dropResponses = new Set();
    this.activeResponse = null; // id of the response being generated
    this.pendingStop = null; // performance.now() when speech_stopped arrived
    this.flushSeq = 0;
    this.flushWaiters = new Map();
    this.zeroChunk = null;
    this.levelTick = 0;
    this.transport = 'websocket';
  }

  // Audio contexts and the microphone; `beforePrompt` runs while the user answers the permission prompt.
  async openMic(beforePrompt) {
    setState('connecting', 'Starting microphone…');
    // Audio contexts are created inside the click so playback is allowed to start.
    try {
      this.playCtx = new AudioContext({ sampleRate: RATE, latencyHint: 'interactive' });
    } catch (e) {
      this.playCtx = new AudioContext({ latencyHint: 'interactive' });
    }
    this.playRatio = RATE / this.playCtx.sampleRate;
    this.captureCtx = new AudioContext({ latencyHint: 'interactive' });
    this.playCtx.resume();
    this.captureCtx.resume();

    if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new ClientError('The microphone needs a secure page: open this demo over https:// or http://localhost.');
    }
    beforePrompt();

    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
      });
    } catch (e) {
      const name = e && e.name;
      if (name === 'NotAllowedError' || name === 'SecurityError') {
        throw new ClientError('Microphone access was denied. Allow the microphone for this site (the icon in the address bar) and connect again.');
      }
      if (name === 'NotFoundError' || name === 'OverconstrainedError') {
        throw new ClientError('No microphone was found. Plug one in and connect again.');
      }
      if (name === 'NotReadableError') {
        throw new ClientError('The microphone is busy or unavailable (is another app using it?).');
      }
      throw new ClientError(`Could not start the microphone: ${e && e.message ? e.message : e}`);
    }
    if (this.closed) {
      stream.getTracks().forEach((t) => t.stop());
      return false;
    }
    this.stream = stream;
    return true;
  }

  async start() {
    stats.transport = 'websocket';
    showTransport('websocket', 'connecting');
    if (!(await this.openMic(() => this.openSocket()))) return;

    await Promise.all([
      this.captureCtx.audioWorklet.addModule(new URL('./capture-worklet.js', import.meta.url)),
      this.playCtx.audioWorklet.addModule(new URL('./playback-worklet.js', import.meta.url)),
    ]);
    if (this.closed) return;

    this.playNode = new AudioWorkletNode(this.playCtx, 'omni-playback', {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { prebufferMs: PREBUFFER_MS, rebufferMs: REBUFFER_MS },
    });
    this.playNode.port.onmessage = (e) => this.onPlayback(e.data);
    this.playNode.connect(this.playCtx.destination);

    const source = this.captureCtx.createMediaStreamSource(this.stream);
    this.captureNode = new AudioWorkletNode(this.captureCtx, 'omni-capture', {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      channelCount: 1,
      channelCountMode: 'explicit',
      processorOptions: { chunkMs: CHUNK_MS },
    });
    this.captureNode.port.onmessage = (e) => this.onMic(e.data);
    source.connect(this.captureNode);
    this.source = source;
    if (this.opened) this.onReady();
    else setState('connecting', 'Connecting to server…');
  }

  openSocket() {
    this.connect(realtimeUrl, () => {
      this.opened = true;
      this.send(SESSION_UPDATE);
      if (this.captureNode) this.onReady();
    });
  }

  // Open the session's WebSocket at urlOf(token); onOpen sends the protocol's first event.
  connect(urlOf, onOpen) {
    let url;
    try {
      url = urlOf(this.token);
    } catch (e) {
      throw new ClientError(`Bad server address: ${e.message}`);
    }
    this.url = url;
    const ws = new WebSocket(url.href);
    this.ws = ws;
    ws.onopen = onOpen;
    ws.onmessage = (e) => this.receive(e.data);
    ws.onerror = () => {}; // details arrive with onclose
    ws.onclose = (e) => this.onClose(e);
  }

  onReady() {
    setState('connected', 'Connected — speak now');
    showTransport(this.transport, 'live');
    // If the browser never starts audio (no output device, autoplay policy), say so instead of hanging.
    setTimeout(() => {
      if (this.closed || stats.micChunks > 0) return;
      this.captureCtx.resume();
      this.playCtx.resume();
      const msg = `No audio from the microphone yet (audio engine ${this.captureCtx.state}). Check that the browser has an audio device and is allowed to play sound here.`;
      note(msg, true);
    }, 3000);
  }

  send(ev) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(ev));
    stats.sent[ev.type] = (stats.sent[ev.type] || 0) + 1;
    return true;
  }

  // -------- microphone
  onMic(msg) {
    if (msg.type !== 'audio') return;
    stats.micChunks++;
    if (++this.levelTick % 2 === 0) {
      const level = this.muted ? 0 : Math.min(1, Math.sqrt(msg.rms) * 2.2);
      ui.level.style.width = `${Math.round(level * 100)}%`;
    }
    if (!this.opened || this.closed) return;
    // Back-pressure: never queue seconds of audio behind a stalled socket.
    if (this.ws.bufferedAmount > 1 << 20) return;
    let b64;
    if (this.muted) {
      // Keep the stream going with silence so server VAD still sees turn ends.
      if (!this.zeroChunk || this.zeroChunk.n !== msg.pcm.length) {
        this.zeroChunk = { n: msg.pcm.length, b64: bytesToBase64(new Uint8Array(msg.pcm.length * 2)) };
      }
      b64 = this.zeroChunk.b64;
    } else {
      b64 = bytesToBase64(new Uint8Array(msg.pcm.buffer, msg.pcm.byteOffset, msg.pcm.byteLength));
    }
    this.send({ type: 'input_audio_buffer.append', audio: b64 });
  }

  setMuted(muted) {
    this.muted = muted;
    if (this.stream) this.stream.getAudioTracks().forEach((t) => { t.enabled = !muted; });
    ui.mute.setAttribute('aria-pressed', String(muted));
    ui.mute.textContent = muted ? 'Unmute' : 'Mute';
    ui.status.textContent = muted ? 'Connected — microphone muted' : 'Connected — speak now';
  }

  // -------- playback
  onPlayback(msg) {
    if (msg.items) {
      for (const [id, n] of Object.entries(msg.items)) {
        const it = this.items.get(id);
        if (it) it.played += n * this.playRatio;
      }
      stats.playedSamples = Math.round(msg.total * this.playRatio);
      stats.underruns = msg.underruns;
    }
    if (msg.type === 'first_sound') {
      const it = this.items.get(msg.itemId);
      if (this.pendingStop !== null && it && !this.dropItems.has(msg.itemId)) {
        // The sample was rendered at msg.contextTime; map it to performance.now().
        const t = performance.now() + (msg.contextTime - this.playCtx.currentTime) * 1000;
        showLatency(Math.max(0, t - this.pendingStop), msg.itemId);
        this.pendingStop = null;
      }
      ui.activity.textContent = 'assistant speaking';
    } else if (msg.type === 'drained') {
      if (ui.activity.textContent === 'assistant speaking') ui.activity.textContent = '';
    } else if (msg.type === 'flushed') {
      const done = this.flushWaiters.get(msg.seq);
      this.flushWaiters.delete(msg.seq);
      if (done) done();
    }
  }

  flushPlayback() {
    if (!this.playNode) return Promise.resolve();
    const seq = ++this.flushSeq;
    return new Promise((resolve) => {
      this.flushWaiters.set(seq, resolve);
      this.playNode.port.postMessage({ type: 'flush', seq });
      setTimeout(() => { if (this.flushWaiters.delete(seq)) resolve(); }, 500);
    });
  }

  async bargeIn() {
    // Stop whatever is playing right now and drop the rest of the interrupted answer.
    const interrupted = [];
    for (const [id, it] of this.items) {
      const unfinished = !it.audioDone || it.played + 1 < it.received;
      if (unfinished && !this.dropItems.has(id)) {
        this.dropItems.add(id);
        interrupted.push(id);
      }
    }
    if (this.activeResponse) this.dropResponses.add(this.activeResponse);
    await this.flushPlayback();
    for (const id of interrupted) {
      const it = this.items.get(id);
      const audioEndMs = Math.floor((Math.min(it.played, it.received) * 1000) / RATE);
      if (it.received > 0) {
        this.send({ type: 'conversation.item.truncate', item_id: id, content_index: 0, audio_end_ms: audioEndMs });
        stats.truncations.push({ item_id: id, audio_end_ms: audioEndMs });
      }
      const b = bubbles.get(id);
      if (b) b.el.classList.add('truncated');
    }
    if (ui.activity.textContent === 'assistant speaking') ui.activity.textContent = '';
  }

  item(id, responseId) {
    let it = this.items.get(id);
    if (!it) {
      it = { responseId, received: 0, played: 0, audioDone: false };
      this.items.set(id, it);
      if (this.items.size > 200) this.items.delete(this.items.keys().next().value);
    }
    return it;
  }

  onAudioDelta(ev) {
    if (this.dropItems.has(ev.item_id) || this.dropResponses.has(ev.response_id)) return;
    const it = this.item(ev.item_id, ev.response_id);
    let pcm = base64ToFloat32(ev.delta);
    it.received += pcm.length;
    if (!this.playNode) return;
    if (this.playRatio !== 1) pcm = resampleLinear(pcm, RATE, this.playCtx.sampleRate);
    this.playNode.port.postMessage({ type: 'push', itemId: ev.item_id, samples: pcm }, [pcm.buffer]);
  }

  // -------- server events
  // one server event as text, from the WebSocket or the WebRTC data channel
  receive(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch (err) {
      note(`Unreadable message from the server: ${String(data).slice(0, 120)}`, true);
      return;
    }
    try {
      this.onEvent(ev);
    } catch (err) {
      console.error('omni-rt: failed to handle', ev && ev.type, err);
    }
  }

  onEvent(ev) {
    stats.received[ev.type] = (stats.received[ev.type] || 0) + 1;
    switch (ev.type) {
      case 'session.created':
        stats.sessionId = ev.session && ev.session.id;
        ui.details.textContent = `Session ${stats.sessionId || ''}`.trim();
        break;
      case 'session.updated':
        break;

      case 'input_audio_buffer.speech_started':
        this.pendingStop = null;
        this.bargeIn();
        if (ev.item_id) bubble(ev.item_id, 'user');
        ui.activity.textContent = 'you are speaking';
        break;
      case 'input_audio_buffer.speech_stopped':
        this.pendingStop = performance.now();
        if (ev.item_id) {
          const b = bubble(ev.item_id, 'user');
          if (!b.text) b.textEl.textContent = 'transcribing…';
        }
        ui.activity.textContent = 'thinking…';
        break;
      case 'input_audio_buffer.committed':
        if (ev.item_id) bubble(ev.item_id, 'user');
        break;

      case 'conversation.item.input_audio_transcription.delta': {
        const b = bubble(ev.item_id, 'user');
        setBubbleText(b, b.text + (ev.delta || ''));
        break;
      }
      case 'conversation.item.input_audio_transcription.completed': {
        const b = bubble(ev.item_id, 'user');
        const text = (ev.transcript || '').trim();
        setBubbleText(b, text, true);
        stats.userTranscripts.push(text);
        break;
      }
      case 'conversation.item.input_audio_transcription.failed': {
        const b = bubble(ev.item_id, 'user');
        setBubbleText(b, '', true);
        b.textEl.textContent = `(transcription failed${ev.error && ev.error.message ? `: ${ev.error.message}` : ''})`;
        break;
      }

      case 'response.created':
        this.activeResponse = ev.response && ev.response.id;
        this.noteServerLatency(ev.response);
        break;
      case 'response.output_item.added':
        if (ev.item && ev.item.type === 'message' && ev.item.role === 'assistant') {
          this.item(ev.item.id, ev.response_id);
          if (!this.dropResponses.has(ev.response_id)) bubble(ev.item.id, 'assistant');
        }
        break;
      case 'response.output_audio.delta':
      case 'response.audio.delta':
        this.onAudioDelta(ev);
        break;
      case 'response.output_audio.done':
      case 'response.audio.done': {
        const it = this.items.get(ev.item_id);
        if (it) it.audioDone = true;
        if (this.playNode) this.playNode.port.postMessage({ type: 'end', itemId: ev.item_id });
        break;
      }
      case 'response.output_audio_transcript.delta':
      case 'response.audio_transcript.delta':
      case 'response.output_text.delta':
      case 'response.text.delta': {
        if (this.dropResponses.has(ev.response_id) && !bubbles.has(ev.item_id)) break;
        const b = bubble(ev.item_id, 'assistant');
        setBubbleText(b, b.text + (ev.delta || ''));
        break;
      }
      case 'response.output_audio_transcript.done':
      case 'response.audio_transcript.done':
      case 'response.output_text.done':
      case 'response.text.done': {
        const text = ev.type.includes('transcript') ? ev.transcript : ev.text;
        if (typeof text === 'string') {
          stats.assistantTranscripts.push(text);
          if (bubbles.has(ev.item_id)) setBubbleText(bubbles.get(ev.item_id), text, true);
        }
        break;
      }
      case 'response.done': {
        const r = ev.response || {};
        if (r.id === this.activeResponse) this.activeResponse = null;
        for (const it of this.items.values()) if (it.responseId === r.id) it.audioDone = true;
        this.noteServerLatency(r);
        if (r.status === 'failed') {
          const err = r.status_details && r.status_details.error;
          note(`Response failed${err && err.message ? `: ${err.message}` : ''}`, true);
        }
        if (ui.activity.textContent === 'thinking…') ui.activity.textContent = '';
        break;
      }
      case 'conversation.item.truncated': {
        const b = bubbles.get(ev.item_id);
        if (b) b.el.classList.add('truncated');
        break;
      }
      case 'error': {
        const err = ev.error || {};
        stats.errors.push(err);
        const what = [err.code || err.type, err.message].filter(Boolean).join(': ');
        note(`Server error — ${what || 'unknown'}`, true);
        break;
      }
      default:
        break;
    }
  }

  noteServerLatency(response) {
    const v = serverLatencyFrom(response);
    if (v !== null && response && response.id !== this.lastServerLatencyId) {
      this.lastServerLatencyId = response.id;
      stats.serverLatencies.push(v);
    }
  }

  // -------- teardown
  onClose(e) {
    const wasOpen = this.opened;
    stats.closeCode = e.code;
    stats.closeReason = e.reason || '';
    if (this.closed) return; // we closed it ourselves
    this.failed = true;
    this.teardown();
    let msg;
    if (!wasOpen) {
      msg = `Could not connect to ${this.url.origin}${this.url.pathname} (code ${e.code}${e.reason ? `: ${e.reason}` : ''}). Is the server running, and is the token right?`;
    } else {
      const known = CLOSE_REASONS[e.code] || 'Connection closed';
      msg = `${known} (code ${e.code}${e.reason ? `: ${e.reason}` : ''})`;
    }
    const clean = wasOpen && e.code === 1000;
    setState(clean ? 'closed' : 'error', msg);
    note(msg, !clean);
    session = null;
  }

  close() {
    if (this.closed) return;
    this.teardown();
    setState('closed', 'Disconnected');
    session = null;
  }

  teardown() {
    this.closed = true;
    ui.details.textContent = 'Tip: use headphones so the assistant does not hear itself.';
    // Drop "listening…" placeholders of turns that never got a transcript.
    for (const [id, b] of bubbles) {
      if (b.role === 'user' && !b.text) {
        b.el.remove();
        bubbles.delete(id);
      }
    }
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) {
      try { this.ws.close(1000, 'client disconnect'); } catch (e) { /* ignore */ }
    }
    if (this.captureNode) {
      this.captureNode.port.postMessage({ type: 'stop' });
      this.captureNode.port.onmessage = null;
      try { this.source.disconnect(); } catch (e) { /* ignore */ }
    }
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    for (const ctx of [this.captureCtx, this.playCtx]) {
      if (ctx && ctx.state !== 'closed') ctx.close().catch(() => {});
    }
    for (const done of this.flushWaiters.values()) done();
    this.flushWaiters.clear();
  }
}

class ClientError extends Error {}
class TransportError extends Error {} // WebRTC could not connect: fall back to WebSocket

// The same session over WebRTC: events on the data channel, audio on Opus tracks. The server clears and
// truncates on barge-in, so this class only listens to the answer's track (latency, played audio).
class RtcSession extends Session {
  constructor(token) {
    super(token);
    this.transport = 'webrtc';
    this.pc = null;
    this.dc = null;
    this.lastAssistantItem = null;
    this.record = new URLSearchParams(location.search).get('record') === '1';
  }

  async start() {
    stats.transport = 'webrtc';
    showTransport('webrtc', 'connecting');
    if (!(await this.openMic(() => {}))) return;
    await Promise.all([
      this.captureCtx.audioWorklet.addModule(new URL('./capture-worklet.js', import.meta.url)),
      this.playCtx.audioWorklet.addModule(new URL('./capture-worklet.js', import.meta.url)),
    ]);
    if (this.closed) return;
    // the microphone level meter (the audio itself goes on the track)
    this.source = this.captureCtx.createMediaStreamSource(this.stream);
    this.captureNode = this.monitorNode(this.captureCtx, this.source, (msg) => this.onMic(msg));

    setState('connecting', 'Connecting over WebRTC…');
    const pc = new RTCPeerConnection();
    this.pc = pc;
    const dc = pc.createDataChannel('oai-events');
    this.dc = dc;
    const open = new Promise((resolve, reject) => {
      dc.onopen = resolve;
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === 'failed') {
          if (!this.opened) reject(new TransportError('the WebRTC connection failed (ICE)'));
          else this.onLost('WebRTC connection lost');
        }
      };
      setTimeout(() => reject(new TransportError(`WebRTC did not connect in ${RTC_CONNECT_TIMEOUT_MS / 1000} s`)), RTC_CONNECT_TIMEOUT_MS);
    });
    open.catch(() => {}); // awaited below; a rejection before that is not 'unhandled'
    dc.onmessage = (e) => this.receive(e.data);
    dc.onclose = () => { if (this.opened) this.onLost('The call ended'); };
    pc.addTrack(this.stream.getAudioTracks()[0], this.stream);
    pc.ontrack = (e) => this.onRemoteTrack(e);

    await pc.setLocalDescription(await pc.createOffer());
    const headers = { 'Content-Type': 'application/sdp' };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    this.url = callsUrl();
    let resp;
    try {
      resp = await fetch(this.url.href, { method: 'POST', body: pc.localDescription.sdp, headers });
    } catch (e) {
      throw new TransportError(`could not reach ${this.url.origin}: ${e.message}`);
    }
    if (!resp.ok) {
      let why = `HTTP ${resp.status}`;
      try { why += `: ${(await resp.json()).error.message}`; } catch (e) { /* not JSON */ }
      if (resp.status === 401 || resp.status === 403) throw new ClientError(`Not authorized — check the API token (${why})`);
      if (resp.status === 503) throw new ClientError(`Server is full — try again later (${why})`);
      throw new TransportError(why);
    }
    stats.callId = (resp.headers.get('Location') || '').split('/').pop() || null;
    await pc.setRemoteDescription({ type: 'answer', sdp: await resp.text() });
    if (this.closed) return;
    await open;
    if (this.closed) return;
    this.opened = true;
    this.send(SESSION_UPDATE);
    this.onReady();
  }

  monitorNode(ctx, source, onmessage) {
    const node = new AudioWorkletNode(ctx, 'omni-capture', {
      numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: 'explicit',
      processorOptions: { chunkMs: CHUNK_MS },
    });
    node.port.onmessage = (e) => onmessage(e.data);
    source.connect(node);
    return node;
  }

  onRemoteTrack(e) {
    const stream = e.streams[0] || new MediaStream([e.track]);
    // Chrome plays a remote WebRTC stream only through a media element; Web Audio then may tap it too.
    ui.remoteAudio.srcObject = stream;
    ui.remoteAudio.play().catch(() => note('The browser blocked audio playback: click the page to allow sound.', true));
    this.remoteSource = this.playCtx.createMediaStreamSource(stream);
    this.playNode = this.monitorNode(this.playCtx, this.remoteSource, (msg) => this.onHeard(msg));
  }

  onHeard(msg) {
    if (msg.type !== 'audio') return;
    if (this.record && window.omniRecorded.length < RECORD_LIMIT_CHUNKS) window.omniRecorded.push(msg.pcm);
    if (msg.rms <= SOUND_RMS) return;
    stats.playedSamples += msg.pcm.length;
    if (this.pendingStop !== null) {
      // the chunk ends now; its first samples sounded CHUNK_MS earlier
      showLatency(Math.max(0, performance.now() - CHUNK_MS - this.pendingStop), this.lastAssistantItem);
      this.pendingStop = null;
    }
    ui.activity.textContent = 'assistant speaking';
  }

  onMic(msg) {
    if (msg.type !== 'audio') return;
    stats.micChunks++;
    if (++this.levelTick % 2 === 0) {
      ui.level.style.width = `${Math.round((this.muted ? 0 : Math.min(1, Math.sqrt(msg.rms) * 2.2)) * 100)}%`;
    }
  }

  send(ev) {
    if (!this.dc || this.dc.readyState !== 'open') return false;
    this.dc.send(JSON.stringify(ev));
    stats.sent[ev.type] = (stats.sent[ev.type] || 0) + 1;
    return true;
  }

  bargeIn() {} // the server clears its outgoing audio and truncates (output_audio_buffer.cleared)

  onEvent(ev) {
    super.onEvent(ev);
    if (ev.type === 'response.output_item.added' && ev.item && ev.item.role === 'assistant') this.lastAssistantItem = ev.item.id;
    else if (ev.type === 'output_audio_buffer.cleared') {
      stats.cleared++;
      if (ui.activity.textContent === 'assistant speaking') ui.activity.textContent = '';
    } else if (ev.type === 'output_audio_buffer.stopped') {
      if (ui.activity.textContent === 'assistant speaking') ui.activity.textContent = '';
    }
  }

  onLost(msg) {
    if (this.closed) return;
    this.failed = true;
    this.teardown();
    setState('error', msg);
    note(msg, true);
    session = null;
  }

  teardown() {
    super.teardown();
    if (this.dc) try { this.dc.close(); } catch (e) { /* ignore */ }
    if (this.pc) try { this.pc.close(); } catch (e) { /* ignore */ }
    ui.remoteAudio.srcObject = null;
  }
}

// The GPT-Live protocol on WS /v1/live/sessions: session.start, the microphone as session.input_audio.append,
// one continuous output stream (session.output_audio.delta, zeros between answers) into the same playback
// worklet, transcripts as deltas with timings. The server decides turns and barge-in: nothing to truncate here.
const LIVE_TURN_GAP_MS = 800; // transcript deltas further apart than this start a new bubble
class LiveWsSession extends Session {
  constructor(token) {
    super(token);
    this.transport = 'live';
    this.turn = { user: null, assistant: null };
    this.lastDelta = { user: 0, assistant: 0 };
    this.turns = 0;
  }

  async start() {
    await super.start();
    stats.transport = 'live';
  }

  openSocket() {
    this.connect(liveUrl, () => this.send({ type: 'session.start', session: { model: 'gpt-live-1' } }));
  }

  onMic(msg) {
    if (msg.type !== 'audio') return;
    stats.micChunks++;
    if (++this.levelTick % 2 === 0) {
      const level = this.muted ? 0 : Math.min(1, Math.sqrt(msg.rms) * 2.2);
      ui.level.style.width = `${Math.round(level * 100)}%`;
    }
    if (!this.opened || this.closed || this.ws.bufferedAmount > 1 << 20) return;
    const b64 = bytesToBase64(new Uint8Array(msg.pcm.buffer, msg.pcm.byteOffset, msg.pcm.byteLength));
    this.send({ type: 'session.input_audio.append', audio: b64 }); // muted: the server hears silence
  }

  setMuted(muted) {
    super.setMuted(muted);
    this.send({ type: muted ? 'session.input_audio.mute' : 'session.input_audio.unmute' });
  }

  transcript(role, delta) {
    const now = performance.now();
    if (!this.turn[role] || now - this.lastDelta[role] > LIVE_TURN_GAP_MS) {
      this.turn[role] = `live_${role}_${++this.turns}`;
      if (role === 'assistant' && this.turn.user) {
        const b = bubbles.get(this.turn.user);
        if (b) stats.userTranscripts.push(b.text.trim());
      }
    }
    this.lastDelta[role] = now;
    const b = bubble(this.turn[role], role);
    setBubbleText(b, b.text + delta);
    if (role === 'assistant') stats.assistantTranscripts[this.turns] = b.text;
    ui.activity.textContent = role === 'user' ? 'you are speaking' : 'assistant speaking';
  }

  onEvent(ev) {
    stats.received[ev.type] = (stats.received[ev.type] || 0) + 1;
    switch (ev.type) {
      case 'session.started':
        this.opened = true;
        stats.sessionId = ev.session && ev.session.id;
        ui.details.textContent = `Session ${stats.sessionId || ''} (GPT-Live)`.trim();
        if (this.captureNode) this.onReady();
        break;
      case 'session.output_audio.delta': {
        let pcm = base64ToFloat32(ev.delta);
        if (!this.playNode) break;
        if (this.playRatio !== 1) pcm = resampleLinear(pcm, RATE, this.playCtx.sampleRate);
        this.playNode.port.postMessage({ type: 'push', itemId: 'live', samples: pcm }, [pcm.buffer]);
        break;
      }
      case 'session.input_transcript.delta':
        this.transcript('user', ev.delta || '');
        break;
      case 'session.output_transcript.delta':
        this.transcript('assistant', ev.delta || '');
        break;
      case 'session.closed':
        note(`Session closed (${ev.reason})`);
        break;
      case 'error': {
        const err = ev.error || {};
        stats.errors.push(err);
        note(`Server error — ${[err.code || err.type, err.message].filter(Boolean).join(': ') || 'unknown'}`, true);
        break;
      }
      default:
        break;
    }
  }
}

async function connect() {
  const token = ui.token.value.trim();
  if (ui.transport.value === 'live') {
    const live = new LiveWsSession(token);
    session = live;
    try {
      await live.start();
    } catch (e) {
      fail(live, e);
    }
    return;
  }
  if (ui.transport.value === 'webrtc' && window.RTCPeerConnection) {
    const rtc = new RtcSession(token);
    session = rtc;
    try {
      await rtc.start();
      return;
    } catch (e) {
      if (!(e instanceof TransportError) || session !== rtc) return fail(rtc, e);
      rtc.teardown();
      stats.fallbacks.push(e.message);
      note(`WebRTC did not connect (${e.message}); using the WebSocket instead.`);
    }
  }
  const s = new Session(token);
  session = s;
  try {
    await s.start();
  } catch (e) {
    fail(s, e);
  }
}

function fail(s, e) {
  if (s.failed) return; // the connection closed first; its message is already shown
  if (s.closed && session !== s) return; // the user cancelled
  const msg = e instanceof ClientError ? e.message : `Could not start: ${e && e.message ? e.message : e}`;
  if (!(e instanceof ClientError)) console.error(e);
  stats.errors.push({ type: 'client', message: msg });
  s.teardown();
  if (session === s) session = null;
  setState('error', msg);
  note(msg, true);
}

$('connect-form').addEventListener('submit', (e) => {
  e.preventDefault();
  if (session) session.close();
  else connect();
});
ui.mute.addEventListener('click', () => {
  if (session) session.setMuted(!session.muted);
});
window.addEventListener('pagehide', () => { if (session) session.close(); });

// ?token=... pre-fills the token field; ?transport=websocket picks the WebSocket, ?transport=live GPT-Live.
const query = new URLSearchParams(location.search);
const preset = query.get('token');
if (preset) ui.token.value = preset;
if (query.get('transport') === 'websocket' || !window.RTCPeerConnection) ui.transport.value = 'websocket';
if (query.get('transport') === 'live') ui.transport.value = 'live';
setState('idle', 'Not connected');
