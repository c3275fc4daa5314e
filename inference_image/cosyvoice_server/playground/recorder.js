"use strict";
// The microphone's samples, block by block, to the page (which makes a WAV of them): an AudioWorklet, as the
// older ScriptProcessorNode is deprecated.
class Recorder extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0][0];
    if (channel) this.port.postMessage(channel.slice());
    return true;
  }
}

registerProcessor("recorder", Recorder);
