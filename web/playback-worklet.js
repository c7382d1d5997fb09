// omni-rt playback worklet: a small jitter buffer for streamed PCM.
//
// The main thread pushes Float32 chunks tagged with the conversation item id
// they belong to. Playback starts once `prebufferMs` of audio is queued (or the
// item's audio is complete), outputs silence on underrun (it never blocks) and
// re-buffers `rebufferMs` before resuming. `flush` drops everything queued at
// once (barge-in). The worklet reports, per item, how many samples it actually
// output, so the page can truncate the item where the user stopped hearing it,
// and the moment it outputs the first audible sample of each item.

const SILENCE = 1e-3; // ~33 in PCM16: anything louder counts as sound

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    const rate = sampleRate;
    this.prebuffer = Math.round(((opts.prebufferMs || 80) * rate) / 1000);
    this.rebuffer = Math.round(((opts.rebufferMs || 40) * rate) / 1000);
    this.reportEvery = Math.round(((opts.reportMs || 50) * rate) / 1000);
    this.queue = []; // [{itemId, data: Float32Array, off}]
    this.buffered = 0; // samples queued, not yet output
    this.state = 'idle'; // idle | buffering | playing
    this.threshold = this.prebuffer;
    this.ended = new Set(); // items whose audio is complete
    this.sounded = new Set(); // items whose first audible sample was output
    this.delta = new Map(); // itemId -> samples output since last report
    this.total = 0; // samples output, all items
    this.sinceReport = 0;
    this.underruns = 0;
    this.starved = false;
    this.lastItem = undefined;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    switch (msg.type) {
      case 'push': {
        if (msg.samples.length === 0) return;
        if (this.starved && msg.itemId === this.lastItem) this.underruns++;
        this.starved = false;
        this.queue.push({ itemId: msg.itemId, data: msg.samples, off: 0 });
        this.buffered += msg.samples.length;
        if (this.state === 'idle') {
          this.state = 'buffering';
          this.threshold = this.prebuffer;
        }
        break;
      }
      case 'end':
        this.ended.add(msg.itemId);
        if (this.ended.size > 64) this.ended.delete(this.ended.values().next().value);
        if (this.state === 'buffering' && this.queue.length === 0 && msg.itemId === this.lastItem) {
          this.starved = false;
          this.state = 'idle';
          this.report('drained');
        }
        break;
      case 'flush':
        this.queue = [];
        this.buffered = 0;
        this.state = 'idle';
        this.starved = false;
        this.report('flushed', msg.seq);
        break;
      default:
        break;
    }
  }

  report(type, seq) {
    const items = {};
    for (const [id, n] of this.delta) items[id] = n;
    this.delta.clear();
    this.sinceReport = 0;
    this.port.postMessage({
      type,
      seq,
      items,
      total: this.total,
      buffered: this.buffered,
      state: this.state,
      underruns: this.underruns,
    });
  }

  canStart() {
    if (this.buffered >= this.threshold) return true;
    const last = this.queue[this.queue.length - 1];
    return !!last && this.ended.has(last.itemId);
  }

  process(inputs, outputs) {
    const out = outputs[0];
    const ch0 = out[0];
    const frames = ch0.length;
    let n = 0;

    if (this.state === 'buffering' && this.canStart()) this.state = 'playing';

    if (this.state === 'playing') {
      while (n < frames && this.queue.length > 0) {
        const seg = this.queue[0];
        const take = Math.min(frames - n, seg.data.length - seg.off);
        const src = seg.data.subarray(seg.off, seg.off + take);
        ch0.set(src, n);
        if (!this.sounded.has(seg.itemId)) {
          for (let i = 0; i < take; i++) {
            if (src[i] > SILENCE || src[i] < -SILENCE) {
              this.sounded.add(seg.itemId);
              if (this.sounded.size > 64) this.sounded.delete(this.sounded.values().next().value);
              this.port.postMessage({
                type: 'first_sound',
                itemId: seg.itemId,
                // context time of that sample, for precise timing on the main thread
                contextTime: currentTime + (n + i) / sampleRate,
              });
              break;
            }
          }
        }
        n += take;
        seg.off += take;
        this.lastItem = seg.itemId;
        this.buffered -= take;
        this.total += take;
        this.sinceReport += take;
        this.delta.set(seg.itemId, (this.delta.get(seg.itemId) || 0) + take);
        if (seg.off >= seg.data.length) this.queue.shift();
      }
      if (n > 0 && this.queue.length === 0) {
        if (this.ended.has(this.lastItem)) {
          this.state = 'idle'; // the item's audio is complete: drained
          this.report('drained');
        } else {
          this.state = 'buffering'; // network fell behind: re-buffer a little
          this.threshold = this.rebuffer;
          this.starved = true;
        }
      }
    }
    // Remainder is silence; output arrays start zeroed but be explicit.
    if (n < frames) ch0.fill(0, n);
    for (let c = 1; c < out.length; c++) out[c].set(ch0);

    if (this.sinceReport >= this.reportEvery) this.report('progress');
    return true;
  }
}

registerProcessor('omni-playback', PlaybackProcessor);
