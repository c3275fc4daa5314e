"use strict";
// The CosyVoice playground: the server's public API driven from a page. The API key lives in `key` below, in this
// tab's memory only: never stored, never put in a URL. Page state the tests read is kept in data-* attributes.
(() => {
  const $ = (id) => document.getElementById(id);
  const API = new URL(".", location.href);  // the server's root: the page is <root>/playground
  const SUBPROTOCOL = "cosyvoice.speech.v1";
  const KEY_SUBPROTOCOL = "cosyvoice.key.";  // + the key in base64url: a browser cannot set a WebSocket's headers
  const WS_FORMATS = ["pcm", "wav", "opus", "mp3"];  // what the WebSocket stream sends (docs/streaming.md)
  const PLAYED_AS_THEY_ARRIVE = new Set(["pcm", "wav"]);  // the others play once complete
  const MEDIA_TYPES = {mp3: "audio/mpeg", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac", wav: "audio/wav",
                       pcm: "application/octet-stream"};
  const LEAD_S = 0.05;  // a chunk starts this far ahead of the audio clock, so its start is never already past
  const HINTS = {
    http: "POST /v1/audio/speech as server-sent events: audio arrives as it is generated.",
    ws: "One WebSocket session: the text goes at once, audio frames come back as it is spoken. Streamed text " +
        "takes no speed.",
    live: "A WebSocket session fed as you type: words are spoken as they arrive, Flush ends a thought (what was " +
          "typed is spoken completely now), End input finishes the session.",
  };

  let key = "";
  let models = [];
  let audioContext = null;
  let run = null;  // the synthesis in progress or last finished
  let clip = null;  // {blob, filename}: what Register uploads
  let recording = null;
  let recorderModule = null;

  class ServerError extends Error {
    constructor(status, error) {
      super(error.message);
      this.status = status;
      this.code = error.code ?? "";
    }
  }

  function authorization() {
    return key ? {Authorization: `Bearer ${key}`} : {};
  }

  // A request to the API; a refusal is thrown as a ServerError with the server's own message.
  async function call(path, init = {}) {
    let response;
    try {
      response = await fetch(new URL(path, API), {...init, cache: "no-store",
                                                  headers: {...init.headers, ...authorization()}});
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ServerError(0, {message: `The server could not be reached (${e.message}).`});
    }
    if (!response.ok) throw await refusal(response);
    return response;
  }

  async function refusal(response) {
    const text = await response.text();
    try {
      const error = JSON.parse(text).error;
      if (error && typeof error.message === "string") return new ServerError(response.status, error);
    } catch { /* not the server's JSON: a proxy's page, say */ }
    return new ServerError(response.status, {message: `HTTP ${response.status} ${response.statusText}` +
                                                      (text ? `: ${text.slice(0, 200)}` : "")});
  }

  function showError(element, error) {
    element.hidden = !error;
    element.dataset.status = error?.status ?? "";
    element.dataset.code = error?.code ?? "";
    element.replaceChildren();
    if (!error) return;
    element.append(error.message);
    if (error.code) {
      const code = document.createElement("small");
      code.textContent = ` ${error.status || ""} ${error.code}`.trimEnd();
      element.append(code);
    }
  }

  // Options from [value, label] pairs; the first of `preferred` that is among them stays selected.
  function fillSelect(select, entries, preferred) {
    select.replaceChildren(...entries.map(([value, label]) => new Option(label, value)));
    const keep = preferred.find((value) => entries.some(([v]) => v === value));
    if (keep !== undefined) select.value = keep;
  }

  // The audio clock. Made (or resumed) inside a click: browsers start audio only after a gesture.
  function audio() {
    audioContext ??= new AudioContext();
    if (audioContext.state === "suspended") audioContext.resume();
    return audioContext;
  }

  const seconds = (s) => `${s.toFixed(2)} s`;
  const size = (n) => n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KB` : `${(n / (1 << 20)).toFixed(2)} MB`;

  // --- the server, its models and voices -------------------------------------------------------------------
  async function connect() {
    const status = $("server-status");
    let ready;
    try {
      ready = await (await fetch(new URL("readyz", API), {cache: "no-store"})).json();
    } catch (e) {
      status.dataset.state = "down";
      status.textContent = `The server does not answer (${e.message}); retrying…`;
      setTimeout(connect, 3000);
      return;
    }
    status.dataset.state = ready.status;
    if (ready.status === "loading" || ready.status === "draining") {
      status.textContent = `The server is ${ready.status}; retrying…`;
      setTimeout(connect, 2000);
      return;
    }
    if (ready.status === "failed") {
      status.textContent = `The server could not load its model: ${ready.error}`;
      return;
    }
    status.textContent = ready.status === "ready" ? `${ready.model} · ${ready.device} · ${ready.precision}`
                                                  : `${ready.status}: ${ready.error}`;
    await loadModels();
  }

  async function loadModels() {
    const form = $("key-form");
    let list;
    try {
      list = await (await call("v1/models")).json();
    } catch (e) {
      form.dataset.needed = String(e.status === 401);
      showError($("key-error"), e);
      if (e.status === 401) $("key").focus();
      return;
    }
    form.dataset.needed = "false";
    showError($("key-error"), null);
    $("key-status").textContent = key ? "Key accepted. Kept in this tab's memory only." : $("key-status").textContent;
    models = list.data;
    fillSelect($("model"), models.map((m) => [m.id, m.id]), [$("model").value]);
    modelChanged();
    await loadVoices();
  }

  const capabilities = () => models.find((m) => m.id === $("model").value)?.capabilities ?? null;
  const transport = () => document.querySelector('input[name="transport"]:checked').value;

  function modelChanged() {
    const caps = capabilities();
    $("instructions-row").hidden = !caps?.instructions;
    $("clone-off").hidden = Boolean(caps?.voice_cloning);
    $("clone-form").hidden = !caps?.voice_cloning;
    transportChanged();
  }

  function transportChanged() {
    const via = transport();
    const formats = via === "http" ? capabilities()?.response_formats ?? [] : WS_FORMATS;
    fillSelect($("format"), formats.map((f) => [f, PLAYED_AS_THEY_ARRIVE.has(f) ? f : `${f} (plays once complete)`]),
               [$("format").value, "wav"]);
    $("speed").disabled = via !== "http";
    $("transport-hint").textContent = HINTS[via];
    $("speak-button").textContent = via === "live" ? "Start session" : "Speak";
  }

  function voiceKind(v) {
    if (v.type === "bundled") return v.mode === "sft" ? "bundled speaker" : "bundled, from a clip";
    const how = v.mode === "zero_shot" ? "zero-shot" : "cross-lingual";
    return v.duration_seconds ? `registered, ${how}, ${v.duration_seconds.toFixed(1)} s clip` : `registered, ${how}`;
  }

  async function loadVoices(select) {
    let list;
    try {
      list = await (await call("v1/audio/voices")).json();
    } catch (e) {
      showError($("voices-error"), e);
      return;
    }
    showError($("voices-error"), null);
    fillSelect($("voice"), list.voices.map((v) => [v.id, v.type === "registered" ? `${v.id} (registered)` : v.id]),
               [select, $("voice").value, list.default]);
    const rows = list.voices.map((v) => {
      const row = document.createElement("tr");
      row.dataset.voice = v.id;
      for (const text of [v.id, voiceKind(v), v.aliases.join(", ")]) row.insertCell().textContent = text;
      const actions = row.insertCell();
      if (v.type === "registered") {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "delete";
        button.textContent = "Delete";
        button.onclick = () => deleteVoice(v.id);
        actions.append(button);
      }
      return row;
    });
    $("voice-table").tBodies[0].replaceChildren(...rows);
    $("voices").dataset.count = String(list.voices.length);
  }

  async function deleteVoice(name) {
    if (!confirm(`Delete the voice ${name}? Requests that name it fail from now on.`)) return;
    try {
      await call(`v1/audio/voices/${encodeURIComponent(name)}`, {method: "DELETE"});
    } catch (e) {
      showError($("voices-error"), e);
      return;
    }
    $("voices").dataset.deleted = name;
    await loadVoices();
  }

  // --- audio: 16-bit samples from pcm and wav streams, played as they arrive ------------------------------------
  function wavHeader(dataBytes, rate) {
    const view = new DataView(new ArrayBuffer(44));
    const tag = (at, text) => [...text].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
    tag(0, "RIFF"); view.setUint32(4, 36 + dataBytes, true); tag(8, "WAVE");
    tag(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
    view.setUint32(24, rate, true); view.setUint32(28, rate * 2, true); view.setUint16(32, 2, true);
    view.setUint16(34, 16, true);
    tag(36, "data"); view.setUint32(40, dataBytes, true);
    return view.buffer;
  }

  // A complete WAV file (a streamed one carries "until the end" sizes, which some players refuse).
  function wavBlob(chunks, rate) {
    const bytes = chunks.reduce((n, c) => n + c.byteLength, 0);
    return new Blob([wavHeader(bytes, rate), ...chunks], {type: "audio/wav"});
  }

  // Where a WAV stream's samples start, and their rate; null until the header has arrived whole.
  function wavStart(bytes) {
    if (bytes.length < 12) return null;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
    if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("The wav stream has no RIFF/WAVE header.");
    let at = 12;
    let rate = null;
    while (at + 8 <= bytes.length) {
      const id = tag(at);
      const length = view.getUint32(at + 4, true);
      if (id === "data") {
        if (rate === null) throw new Error("The wav stream has no fmt chunk before its data.");
        return {rate, data: at + 8};
      }
      if (id === "fmt " && at + 16 <= bytes.length) rate = view.getUint32(at + 12, true);
      at += 8 + length + (length & 1);
    }
    return null;
  }

  function concat(a, b) {
    const out = new Uint8Array(a.length + b.length);
    out.set(a);
    out.set(b, a.length);
    return out;
  }

  // The whole 16-bit samples of a pcm stream, or of a wav stream past its header; a sample split between two
  // chunks waits for its second byte.
  class SampleReader {
    constructor(wav, rate) {
      this.header = wav ? new Uint8Array(0) : null;
      this.rate = rate;
      this.odd = null;
    }

    push(bytes) {
      if (this.header) {
        this.header = concat(this.header, bytes);
        const start = wavStart(this.header);
        if (!start) return new Int16Array(0);
        this.rate = start.rate;
        bytes = this.header.subarray(start.data);
        this.header = null;
      }
      if (this.odd) bytes = concat(this.odd, bytes);
      this.odd = bytes.length % 2 ? bytes.slice(-1) : null;
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length - (bytes.length % 2));
      const samples = new Int16Array(view.byteLength / 2);
      for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true);
      return samples;
    }
  }

  // Plays chunks back to back on the audio clock; `gaps` counts the times the audio ran out before the next chunk.
  class Player {
    constructor(changed) {
      this.changed = changed;
      this.next = 0;
      this.sources = new Set();
      this.played = 0;
      this.gaps = 0;
    }

    play(samples, rate) {
      const ctx = audio();
      const buffer = ctx.createBuffer(1, samples.length, rate);
      const channel = buffer.getChannelData(0);
      for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(ctx.destination);
      if (this.next && this.next < ctx.currentTime) this.gaps++;
      const at = Math.max(ctx.currentTime + LEAD_S, this.next);
      source.start(at);
      this.next = at + buffer.duration;
      this.sources.add(source);
      source.onended = () => {
        this.sources.delete(source);
        this.played += buffer.duration;
        this.changed();
      };
    }

    stop() {
      for (const source of this.sources) {
        source.onended = null;
        source.stop();
      }
      this.sources.clear();
    }
  }

  function base64Bytes(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  function base64url(text) {
    const binary = String.fromCharCode(...new TextEncoder().encode(text));
    return btoa(binary).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  }

  // --- one synthesis: what arrives, how fast, and the page's display of it --------------------------------------
  class Run {
    constructor(via, format) {
      this.via = via;
      this.format = format;
      this.reader = PLAYED_AS_THEY_ARRIVE.has(format) ? new SampleReader(format === "wav", null) : null;
      this.player = new Player(() => this.render());
      this.abort = new AbortController();
      this.ws = null;
      this.sent = "";  // live: the text sent so far
      this.t0 = null;
      this.firstAt = null;
      this.lastAt = null;
      this.bytes = 0;
      this.received = [];  // every audio byte as it came
      this.samples = [];  // pcm and wav: the 16-bit samples, without a header
      this.sampleCount = 0;
      this.audioSeconds = 0;
      this.rtf = null;
      this.segments = 0;
      this.segmentEnd = 0;
      this.state = "connecting";
      this.resultPlayed = 0;
      clearOutput();
    }

    get ended() {
      return ["done", "error", "stopped"].includes(this.state);
    }

    // The clock of time to first audio and the real-time factor starts: the request, or the first text sent.
    begin() {
      this.t0 ??= performance.now();
    }

    audio(bytes) {
      if (this.ended || !bytes.length) return;
      const now = performance.now();
      this.firstAt ??= now;
      this.lastAt = now;
      this.bytes += bytes.length;
      this.received.push(bytes);
      if (this.reader) {
        const samples = this.reader.push(bytes);
        if (samples.length) {
          this.samples.push(samples);
          this.sampleCount += samples.length;
          this.audioSeconds = this.sampleCount / this.reader.rate;
          this.player.play(samples, this.reader.rate);
        }
      }
      this.state = "streaming";
      this.render();
    }

    event(event) {
      switch (event.type) {
        case "speech.audio.delta": this.audio(base64Bytes(event.audio)); break;
        case "speech.segment": case "speech.segment.done": this.segment(event); break;
        case "speech.audio.done": this.done(); break;
        case "error": this.fail(new ServerError(0, event.error)); break;
      }
    }

    // speech.segment (SSE, where the server reports timestamps) and speech.segment.done (WebSocket): the segment's
    // place in the audio as the server gives it (start_s, end_s), else from its length (usage.audio_seconds).
    segment(event) {
      const length = event.usage?.audio_seconds;
      const start = event.start_s ?? this.segmentEnd;
      const end = event.end_s ?? (length === undefined ? null : start + length);
      if (end !== null) this.segmentEnd = end;
      const row = $("segments").tBodies[0].insertRow();
      const arrived = this.t0 === null ? "—" : `${Math.round(performance.now() - this.t0)} ms`;
      for (const text of [String(event.segment ?? this.segments), event.text ?? "",
                          end === null ? "—" : `${start.toFixed(2)}–${end.toFixed(2)} s`, arrived]) {
        row.insertCell().textContent = text;
      }
      $("segments").hidden = false;
      if (event.text) $("segments").dataset.text = "true";
      this.segments++;
      this.render();
    }

    async done() {
      if (this.ended) return;
      this.state = "finishing";
      const result = this.reader ? wavBlob(this.samples, this.reader.rate) : new Blob(this.received,
                                                                                    {type: MEDIA_TYPES[this.format]});
      if (!this.reader) {
        this.audioSeconds = await decodedSeconds(result) ?? 0;
        if (this.ended) return;  // stopped meanwhile
      }
      if (this.via !== "live" && this.audioSeconds > 0 && this.lastAt !== null) {
        this.rtf = (this.lastAt - this.t0) / 1000 / this.audioSeconds;
      }
      if (this.bytes) {
        const download = this.format === "pcm" ? new Blob(this.received, {type: MEDIA_TYPES.pcm}) : result;
        showResult(result, download, `speech.${this.format}`, !this.reader, (played) => {
          this.resultPlayed = played;
          this.render();
        });
      }
      this.finish("done");
    }

    fail(error) {
      if (this.ended) return;
      showError($("speak-error"), error);
      this.finish("error");
    }

    // Stops the stream and what is still to play of it.
    stop() {
      this.player.stop();
      if (this.ended) this.render();
      else this.finish("stopped");
    }

    finish(state) {
      this.state = state;
      this.abort.abort();
      if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000);
      idle();
      this.render();
    }

    render() {
      const panel = $("speak");
      const ttfa = this.firstAt === null ? null : this.firstAt - this.t0;
      const played = this.reader ? this.player.played : this.resultPlayed;
      const playing = this.reader ? this.player.sources.size > 0 : false;
      const playback = playing ? "playing" : played === 0 ? "" : this.ended ? "ended" : "waiting";
      Object.assign(panel.dataset, {
        state: this.state, bytes: String(this.bytes), audioSeconds: this.audioSeconds.toFixed(3),
        playedSeconds: played.toFixed(3), playback, ttfaMs: ttfa === null ? "" : ttfa.toFixed(1),
        rtf: this.rtf === null ? "" : this.rtf.toFixed(3), segments: String(this.segments),
        gaps: String(this.player.gaps),
      });
      $("ttfa").textContent = ttfa === null ? "—" : `${Math.round(ttfa)} ms`;
      $("rtf").textContent = this.rtf === null ? "—" : this.rtf.toFixed(3);
      $("rtf").title = this.via === "live" ? "Not measured when the text is typed live: typing sets the pace" : "";
      $("audio-seconds").textContent = this.audioSeconds ? seconds(this.audioSeconds) : "—";
      $("bytes").textContent = this.bytes ? size(this.bytes) : "—";
      $("gaps").textContent = this.reader && this.bytes ? String(this.player.gaps) : "—";
      if (this.ended) $("stop").disabled = !playing;  // Stop also silences what is still to play
    }
  }

  async function decodedSeconds(blob) {
    try {
      return (await audio().decodeAudioData(await blob.arrayBuffer())).duration;
    } catch {
      return null;  // a format this browser cannot decode: the length stays unknown
    }
  }

  let resultUrls = [];

  function clearOutput() {
    showError($("speak-error"), null);
    for (const id of ["ttfa", "rtf", "audio-seconds", "bytes", "gaps"]) $(id).textContent = "—";
    $("segments").tBodies[0].replaceChildren();
    $("segments").hidden = true;
    delete $("segments").dataset.text;
    $("result").hidden = true;
    $("result-audio").onended = null;
    $("result-audio").removeAttribute("src");
    resultUrls.forEach(URL.revokeObjectURL);
    resultUrls = [];
  }

  function showResult(result, download, filename, autoplay, played) {
    const element = $("result-audio");
    const [src, href] = [URL.createObjectURL(result), URL.createObjectURL(download)];
    resultUrls = [src, href];
    element.src = src;
    element.onended = () => played(element.duration);
    const link = $("download");
    link.href = href;
    link.download = filename;
    link.textContent = `Download ${filename} (${size(download.size)})`;
    $("result").hidden = false;
    if (autoplay) element.play().catch((e) => showError($("speak-error"), new Error(`Playback failed: ${e.message}`)));
  }

  function busy() {
    $("speak-button").disabled = true;
    $("stop").disabled = false;
    const live = run.via === "live";
    $("flush").hidden = $("end").hidden = !live;
    $("flush").disabled = $("end").disabled = false;
  }

  function idle() {
    $("speak-button").disabled = false;
    $("stop").disabled = true;
    $("flush").hidden = $("end").hidden = true;
    $("text").readOnly = false;
  }

  // --- speaking over HTTP ----------------------------------------------------------------------------------
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const data = buffer.slice(0, cut).split("\n").filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart()).join("\n");
        buffer = buffer.slice(cut + 2);
        if (data) onEvent(JSON.parse(data));
      }
    }
  }

  async function speakHttp(r, text, options) {
    // `timestamps` asks for speech.segment events; a server without them ignores the field (unknown fields are
    // ignored, as OpenAI's API does).
    const body = {model: options.model, voice: options.voice, input: text, response_format: options.format,
                  speed: options.speed, stream: true, stream_format: "sse", timestamps: "segment"};
    if (options.instructions) body.instructions = options.instructions;
    if (r.reader) r.reader.rate = capabilities().sample_rate;  // pcm has no header to say it
    r.begin();
    try {
      const response = await call("v1/audio/speech", {method: "POST", headers: {"Content-Type": "application/json"},
                                                      body: JSON.stringify(body), signal: r.abort.signal});
      await readEvents(response.body, (event) => r.event(event));
      if (!r.ended && r.state !== "finishing") {
        r.fail(new Error("The stream ended before the server said it was complete (no speech.audio.done)."));
      }
    } catch (e) {
      if (e.name !== "AbortError") r.fail(e);
    }
  }

  // --- speaking over the WebSocket -------------------------------------------------------------------------
  // Why a handshake failed: browsers report only that it did, so the key is checked over HTTP to show the server's
  // own words when that is the cause.
  async function handshakeRefusal() {
    try {
      await call("v1/models");
    } catch (e) {
      return e;
    }
    return new Error("The server refused the WebSocket connection, and browsers do not pass on why: it refuses " +
                     "pages from origins it does not allow (--stream-allowed-origins) and clients over their " +
                     "connection limits; its log says which.");
  }

  function speakWs(r, text, options) {
    const url = new URL("v1/audio/speech/stream", API);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url, key ? [SUBPROTOCOL, KEY_SUBPROTOCOL + base64url(key)] : [SUBPROTOCOL]);
    ws.binaryType = "arraybuffer";
    r.ws = ws;
    let opened = false;
    const send = (event) => ws.send(JSON.stringify(event));
    ws.onopen = () => {
      opened = true;
      const session = {model: options.model, voice: options.voice, response_format: options.format};
      if (options.instructions) session.instructions = options.instructions;
      send({type: "session.update", session});
    };
    ws.onmessage = (message) => {
      if (typeof message.data !== "string") {
        r.audio(new Uint8Array(message.data));
        return;
      }
      const event = JSON.parse(message.data);
      if (event.type !== "session.created") {
        r.event(event);
        return;
      }
      if (r.reader) r.reader.rate = event.session.sample_rate;
      r.state = "streaming";
      r.render();
      if (r.via === "live") {
        $("text").focus();
        sendTyped();  // what was typed before the session opened
      } else {
        r.begin();
        send({type: "input_text.append", text});
        send({type: "input_text.end"});
      }
    };
    ws.onclose = async (event) => {
      if (r.ended || r.state === "finishing") return;
      r.fail(opened ? new Error(`The connection closed (code ${event.code}${event.reason ? `, ${event.reason}` : ""}) ` +
                                "before the audio was complete.")
                    : await handshakeRefusal());
    };
  }

  // Live: the text typed since the last send goes as one append. Text already sent cannot be taken back, so an
  // edit before its end is undone.
  function sendTyped() {
    const area = $("text");
    if (!run || run.via !== "live" || run.ended || run.ws?.readyState !== WebSocket.OPEN || area.readOnly) return;
    if (!area.value.startsWith(run.sent)) {
      area.value = run.sent;
      $("transport-hint").textContent = "Text already sent cannot be changed: type on at its end.";
      return;
    }
    const delta = area.value.slice(run.sent.length);
    if (!delta) return;
    run.sent = area.value;
    if (delta.trim()) run.begin();
    run.ws.send(JSON.stringify({type: "input_text.append", text: delta}));
  }

  function sendControl(type) {
    if (run?.ws?.readyState !== WebSocket.OPEN) return;
    sendTyped();
    run.ws.send(JSON.stringify({type}));
    if (type === "input_text.end") {
      $("text").readOnly = true;
      $("flush").disabled = $("end").disabled = true;
    }
  }

  function speak(event) {
    event.preventDefault();
    audio();  // inside the click: the gesture that lets the page play audio
    const via = transport();
    const text = $("text").value;
    if (via !== "live" && !text.trim()) {
      showError($("speak-error"), new Error("Type the text to speak."));
      return;
    }
    if (!models.length) {
      showError($("speak-error"), new Error("Not connected to the server yet."));
      return;
    }
    run?.stop();  // and its audio
    const options = {model: $("model").value, voice: $("voice").value, format: $("format").value,
                     speed: Number($("speed").value), instructions: $("instructions-row").hidden ? ""
                                                                                     : $("instructions").value.trim()};
    run = new Run(via, options.format);
    busy();
    run.render();
    if (via === "http") speakHttp(run, text, options);
    else speakWs(run, text, options);
  }

  // --- cloning ---------------------------------------------------------------------------------------------
  function setClip(blob, filename, description) {
    clip = {blob, filename};
    const preview = $("clip-preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(blob);
    preview.hidden = false;
    $("record-status").textContent = description;
    $("clone").dataset.clip = filename;
  }

  async function toggleRecording() {
    if (recording) {
      stopRecording();
      return;
    }
    showError($("clone-error"), null);
    if (!navigator.mediaDevices?.getUserMedia) {
      showError($("clone-error"), new Error("Recording needs a secure page: open the playground over https, or at " +
                                            "http://localhost (e.g. through kubectl port-forward). Choosing a " +
                                            "file works anywhere."));
      return;
    }
    const ctx = audio();
    const button = $("record");
    button.disabled = true;  // until the microphone answers
    let stream;
    try {
      // the voice as the microphone hears it: no processing that would change its timbre
      stream = await navigator.mediaDevices.getUserMedia({audio: {channelCount: 1, echoCancellation: false,
                                                                  noiseSuppression: false, autoGainControl: false}});
      recorderModule ??= ctx.audioWorklet.addModule(new URL("playground/recorder.js", API));
      await recorderModule;
    } catch (e) {
      showError($("clone-error"), new Error(`The microphone is not available: ${e.message}`));
      stream?.getTracks().forEach((track) => track.stop());
      return;
    } finally {
      button.disabled = false;
    }
    const source = ctx.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(ctx, "recorder", {numberOfOutputs: 0});
    const parts = [];
    node.port.onmessage = (message) => parts.push(message.data);
    source.connect(node);
    const started = performance.now();
    const tick = () => {
      $("record-status").textContent = `Recording… ${((performance.now() - started) / 1000).toFixed(1)} s`;
    };
    recording = {stream, source, node, parts, rate: ctx.sampleRate, timer: setInterval(tick, 200)};
    tick();
    $("record").textContent = "Stop recording";
    $("clone").dataset.recording = "true";
  }

  function stopRecording() {
    const r = recording;
    recording = null;
    clearInterval(r.timer);
    r.source.disconnect();
    r.node.port.onmessage = null;
    r.stream.getTracks().forEach((track) => track.stop());
    const count = r.parts.reduce((n, part) => n + part.length, 0);
    const samples = new Int16Array(count);
    let at = 0;
    for (const part of r.parts) {
      for (const x of part) samples[at++] = Math.round(Math.max(-1, Math.min(1, x)) * 32767);
    }
    $("clone-file").value = "";
    setClip(wavBlob([samples.buffer], r.rate), "recording.wav",
            `Recorded ${(count / r.rate).toFixed(1)} s from the microphone.`);
    $("record").textContent = "Record";
    $("clone").dataset.recording = "false";
  }

  async function register(event) {
    event.preventDefault();
    const status = $("clone-status");
    showError($("clone-error"), null);
    status.textContent = "";
    if (recording) stopRecording();
    if (!clip) {
      showError($("clone-error"), new Error("Record a clip or choose a file first."));
      return;
    }
    const form = new FormData();
    form.append("name", $("clone-name").value.trim());
    form.append("audio", clip.blob, clip.filename);
    const transcript = $("clone-transcript").value.trim();
    if (transcript) form.append("transcript", transcript);
    const panel = $("clone");
    panel.dataset.state = "registering";
    $("register").disabled = true;
    status.textContent = "Registering: the server extracts the voice from the clip…";
    try {
      const card = await (await call("v1/audio/voices", {method: "POST", body: form})).json();
      status.textContent = `Registered ${card.id} (${voiceKind(card)}); it is selected under Speak.`;
      panel.dataset.voice = card.id;
      panel.dataset.state = "registered";
      await loadVoices(card.id);
    } catch (e) {
      status.textContent = "";
      showError($("clone-error"), e);
      panel.dataset.state = "error";
    } finally {
      $("register").disabled = false;
    }
  }

  // --- wiring ----------------------------------------------------------------------------------------------
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    key = $("key").value.trim();
    loadModels();
  });
  $("model").addEventListener("change", modelChanged);
  for (const radio of document.querySelectorAll('input[name="transport"]')) {
    radio.addEventListener("change", transportChanged);
  }
  $("speak-form").addEventListener("submit", speak);
  $("stop").addEventListener("click", () => run?.stop());
  $("flush").addEventListener("click", () => sendControl("input_text.flush"));
  $("end").addEventListener("click", () => sendControl("input_text.end"));
  $("text").addEventListener("input", (event) => {
    if (!event.isComposing) sendTyped();  // an input method's word goes once it is composed
  });
  $("text").addEventListener("compositionend", sendTyped);
  $("clone-form").addEventListener("submit", register);
  $("record").addEventListener("click", toggleRecording);
  $("clone-file").addEventListener("change", () => {
    const file = $("clone-file").files[0];
    if (file) setClip(file, file.name, `${file.name}, ${size(file.size)}`);
  });
  connect();
})();
