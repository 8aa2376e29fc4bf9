-- 08 The roofline: why decode is memory-bound and prefill compute-bound.
--
-- Arithmetic intensity = FLOPs / bytes moved, both counted by the kernels
-- for one step. A machine's ridge point = peak FLOP/s / bandwidth: below
-- it a step waits for memory, above it for arithmetic. Small models fit in
-- this machine's L3 cache, so the argument uses the measured intensity
-- against the measured ridge rather than wall time.
lab.lesson{
    title = "The roofline: decode is memory-bound, prefill compute-bound",
    claims = {"why1"},
}

local machine = lab.machine()
lab.say(string.format("This machine: %.1f GB/s stream read, %.0f GFLOP/s fp16 matmul: ridge %.1f FLOP/byte.",
    machine.bandwidth / 1e9, machine.peak_flops / 1e9, machine.ridge))
for _, d in ipairs(lab.devices()) do
    lab.say(string.format("  %-16s %6.0f GB/s %6.0f TFLOP/s  ridge %.0f FLOP/byte", d.name, d.bandwidth / 1e9,
        d.peak_flops / 1e12, d.ridge))
end
lab.pause()

local model = lab.model(lab.full and "medium" or "small")
local prompt = lab.full and 512 or 128
local prefill = lab.time{model = model, phase = "prefill", tokens = prompt, repeats = 3, threads = 1}
local decode = lab.time{model = model, phase = "decode", tokens = 8, repeats = 3, threads = 1}
local decode_step_s = decode.cpu_seconds / 8
local prefill_token_s = prefill.cpu_seconds / prompt
local h100_decode = lab.roofline{bytes = decode.bytes / 8, flops = decode.flops / 8, device = "H100"}

-- Achieved rates: decode's bytes per second against the bandwidth, prefill's
-- FLOPs per second against the peak (one thread here, so both fall short).
local decode_bandwidth = decode.bytes / decode.cpu_seconds
local prefill_rate = prefill.flops / prefill.cpu_seconds
lab.check{
    id = "why1",
    claim = "decode is memory-bound and prefill compute-bound (intensity against the ridge point)",
    bank_answer = true,
    verdict = decode.intensity < machine.ridge and prefill.intensity > machine.ridge,
    evidence = string.format("%s: decode %.2f FLOP/B, prefill of %d tokens %.1f FLOP/B, ridge %.1f; per token decode %.2f ms vs "
        .. "prefill %.3f ms CPU (x%.0f); decode moves %.1f GB/s, prefill computes %.1f GFLOP/s; on an H100 a decode step "
        .. "would be %s-bound (%.1f vs ridge %.0f)",
        model:info().name, decode.intensity, prompt, prefill.intensity, machine.ridge, decode_step_s * 1e3,
        prefill_token_s * 1e3, decode_step_s / prefill_token_s, decode_bandwidth / 1e9, prefill_rate / 1e9,
        h100_decode.bound, h100_decode.intensity, h100_decode.ridge),
}
