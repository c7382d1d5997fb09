// omni-rt microphone capture worklet.
//
// Runs in the AudioWorkletGlobalScope of the capture AudioContext (at the
// device's native rate, usually 48 kHz). Low-pass filters, resamples to
// 24 kHz mono, converts to PCM16 and posts one Int16Array per `chunkMs`
// (default 20 ms) to the main thread, together with the chunk's RMS level.

const OUT_RATE = 24000;

// Windowed-sinc low-pass FIR (Blackman window). `cutoff` is a fraction of the
// input rate (0 .. 0.5).
function designLowpass(taps, cutoff) {
  const h = new Float32Array(taps);
  const m = taps - 1;
  let sum = 0;
  for (let i = 0; i < taps; i++) {
    const x = i - m / 2;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const w = 0.42 - 0.5 * Math.cos((2 * Math.PI * i) / m) + 0.08 * Math.cos((4 * Math.PI * i) / m);
    h[i] = sinc * w;
    sum += h[i];
  }
  for (let i = 0; i < taps; i++) h[i] /= sum;
  return h;
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.inRate = sampleRate; // global of the worklet scope
    this.step = this.inRate / OUT_RATE; // input samples per output sample
    const chunkMs = opts.chunkMs || 20;
    this.chunk = new Int16Array(Math.round((OUT_RATE * chunkMs) / 1000));
    this.fill = 0;
    this.sumSq = 0;

    // Anti-aliasing filter only when downsampling.
    this.fir = this.step > 1.0001 ? designLowpass(31, (0.45 * OUT_RATE) / this.inRate) : null;
    const histLen = this.fir ? this.fir.length - 1 : 0;
    // Ring of the last FIR input samples, stored twice to avoid wrap checks.
    this.hist = new Float32Array(Math.max(1, histLen) * 2);
    this.histPos = 0;
    this.histLen = histLen;

    // Filtered signal awaiting interpolation; `t` is the fractional position
    // (in input samples, relative to buf[0]) of the next output sample.
    this.buf = new Float32Array(1024);
    this.bufLen = 0;
    this.t = 0;

    this.running = true;
    this.port.onmessage = (e) => {
      if (e.data && e.data.type === 'stop') this.running = false;
    };
  }

  filterInto(input) {
    // Ensure room.
    if (this.bufLen + input.length > this.buf.length) {
      const nb = new Float32Array((this.bufLen + input.length) * 2);
      nb.set(this.buf.subarray(0, this.bufLen));
      this.buf = nb;
    }
    if (!this.fir) {
      this.buf.set(input, this.bufLen);
      this.bufLen += input.length;
      return;
    }
    const h = this.fir;
    const n = this.histLen;
    const hist = this.hist;
    for (let i = 0; i < input.length; i++) {
      const x = input[i];
      // hist[histPos .. histPos+n-1] holds the previous n samples, oldest first.
      const base = this.histPos;
      let acc = h[n] * x;
      for (let k = 0; k < n; k++) acc += h[k] * hist[base + k];
      this.buf[this.bufLen++] = acc;
      // Push x into the doubled ring (overwrites the oldest).
      hist[base] = x;
      hist[base + n] = x;
      this.histPos = (base + 1) % n;
    }
  }

  emit(sample) {
    let s = sample;
    if (s > 1) s = 1;
    else if (s < -1) s = -1;
    this.sumSq += s * s;
    this.chunk[this.fill++] = s < 0 ? s * 0x8000 : s * 0x7fff;
    if (this.fill === this.chunk.length) {
      const out = this.chunk;
      const len = out.length;
      const rms = Math.sqrt(this.sumSq / len);
      this.port.postMessage({ type: 'audio', pcm: out, rms }, [out.buffer]); // detaches `out`
      this.chunk = new Int16Array(len);
      this.fill = 0;
      this.sumSq = 0;
    }
  }

  process(inputs) {
    if (!this.running) return false;
    const input = inputs[0];
    if (!input || input.length === 0 || !input[0]) return true;
    // Downmix to mono.
    let mono = input[0];
    if (input.length > 1) {
      if (!this.mix || this.mix.length !== input[0].length) this.mix = new Float32Array(input[0].length);
      mono = this.mix;
      mono.fill(0);
      for (let c = 0; c < input.length; c++) {
        const ch = input[c];
        for (let i = 0; i < ch.length; i++) mono[i] += ch[i];
      }
      for (let i = 0; i < mono.length; i++) mono[i] /= input.length;
    }
    this.filterInto(mono);

    if (this.step === 1) {
      for (let i = 0; i < this.bufLen; i++) this.emit(this.buf[i]);
      this.bufLen = 0;
      return true;
    }
    // Linear interpolation on the (band-limited) signal.
    let t = this.t;
    while (t + 1 < this.bufLen) {
      const i = t | 0;
      const f = t - i;
      this.emit(this.buf[i] * (1 - f) + this.buf[i + 1] * f);
      t += this.step;
    }
    // Drop consumed samples, keep the one needed for interpolation.
    const keep = t | 0;
    if (keep > 0) {
      this.buf.copyWithin(0, keep, this.bufLen);
      this.bufLen -= keep;
      t -= keep;
    }
    this.t = t;
    return true;
  }
}

registerProcessor('omni-capture', CaptureProcessor);
