// Greedy generation with a real llama.cpp (node-llama-cpp's prebuilt CPU binaries): for each
// request line on stdin, {"model": PATH, "prompt": TEXT, "n": N}, prints one JSON line
// {"model", "prompt_ids", "ids"} or {"model", "error"}. Used by tests/test_llama_interop.sh to
// check that GGUF files written by floe load in llama.cpp and give floe's greedy tokens.
// With "force": [ids] (floe's greedy continuation) it instead evaluates prompt + ids and prints
// {"model", "prompt_ids", "gaps"}: per forced token, llama.cpp's log-probability of its own top
// token minus that of the forced one (0 when llama.cpp's argmax is floe's token).
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { createInterface } from "node:readline";

const llama = await getLlama({
  gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
  logLevel: LlamaLogLevel.error, // the test prints llama.cpp's own messages only when they are errors
});

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const req = JSON.parse(line);
  try {
    const model = await llama.loadModel({ modelPath: req.model, gpuLayers: 0 });
    const ctx = await model.createContext({ contextSize: 512, batchSize: 512, threads: 2, flashAttention: false });
    const seq = ctx.getSequence();
    const prompt = model.tokenize(req.prompt, false);
    if (req.force) {
      const gen = { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } };
      const input = [...prompt, ...req.force.slice(0, -1)].map((t, i, a) =>
        i >= prompt.length - 1 ? [t, { generateNext: gen }] : t);
      const res = await seq.controlledEvaluate(input);
      const gaps = [];
      for (let i = prompt.length - 1, k = 0; k < req.force.length; i++, k++) {
        const pr = res[i]?.next?.probabilities;
        let best = 0;
        for (const v of pr.values()) if (v > best) best = v;
        const pf = pr.get(req.force[k]) ?? 0;
        gaps.push(pf > 0 ? Math.log(best) - Math.log(pf) : 1e9);
      }
      console.log(JSON.stringify({ model: req.model, prompt_ids: prompt, gaps }));
      await ctx.dispose();
      await model.dispose();
      continue;
    }
    const ids = [];
    // temperature 0: llama.cpp's greedy sampler (argmax of the logits)
    for await (const tok of seq.evaluate(prompt, { temperature: 0 })) {
      ids.push(tok);
      if (ids.length >= req.n) break;
    }
    console.log(JSON.stringify({ model: req.model, prompt_ids: prompt, ids }));
    await ctx.dispose();
    await model.dispose();
  } catch (e) {
    console.log(JSON.stringify({ model: req.model, error: String(e && e.message || e) }));
  }
}
