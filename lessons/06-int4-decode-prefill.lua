-- 06 INT4 weights in decode and in prefill. W4A16 stores 4-bit codes and
-- dequantizes them in registers; the math stays in floating point.
--
-- Decode reads every weight once per token, prefill reads every weight once
-- for the whole prompt. So decode is limited by the bytes it streams and
-- prefill by its arithmetic, and the dequantization work W4A16 adds costs
-- nothing where bytes are the limit, and real time where arithmetic is.
--
-- Quick mode: the small preset (27 MiB in fp16) fits this machine's 32 MiB
-- L3 cache, so its decode time cannot show the memory effect; decode is
-- judged from the bytes the kernels read and the roofline of this machine.
-- With lab.full (make lessons) the medium preset (192 MiB, memory-bound)
-- is timed as well, and its measured speed-up is part of the verdict.
-- Times are CPU times with one thread (lab.time's cpu_seconds).
lab.lesson{
    title = "INT4 weights: faster decode, slower prefill",
    claims = {"tf2", "why2", "recall1"},
}

local machine = lab.machine()
local fp16 = lab.model("small")
local int4 = lab.quantize_model(fp16, "w4a16")
lab.say(string.format("small: %.1f MiB in fp16, %.1f MiB as W4A16 (4-bit codes + fp16 scale and zero-point per 64).",
    fp16:info().weight_bytes / 2 ^ 20, int4:info().weight_bytes / 2 ^ 20))

-- Prefill: one prompt of 128 tokens, in one step.
local prefill_fp16 = lab.time{model = fp16, phase = "prefill", tokens = 128, repeats = 3, threads = 1}
local prefill_int4 = lab.time{model = int4, phase = "prefill", tokens = 128, repeats = 3, threads = 1}
local prefill_ratio = prefill_int4.cpu_seconds / prefill_fp16.cpu_seconds
lab.check{
    id = "tf2",
    claim = "weight-only INT4 always speeds up prefill",
    bank_answer = false,
    verdict = prefill_ratio < 0.95,
    evidence = string.format("128-token prefill of small: fp16 %.1f ms, W4A16 %.1f ms CPU (x%.2f the time); intensity %.0f and "
        .. "%.0f FLOP/B, above this machine's ridge %.1f: compute-bound, so dequantizing is extra work",
        prefill_fp16.cpu_seconds * 1e3, prefill_int4.cpu_seconds * 1e3, prefill_ratio, prefill_fp16.intensity,
        prefill_int4.intensity, machine.ridge),
}
lab.pause()

-- Decode: 8 tokens at batch 1.
local decode_fp16 = lab.time{model = fp16, phase = "decode", tokens = 8, repeats = 3, threads = 1}
local decode_int4 = lab.time{model = int4, phase = "decode", tokens = 8, repeats = 3, threads = 1}
local bytes_ratio = decode_fp16.weight_bytes / decode_int4.weight_bytes
local function roofline_seconds(t)
    return lab.roofline{bytes = t.bytes, flops = t.flops, device = "machine"}.seconds
end
local projected = roofline_seconds(decode_fp16) / roofline_seconds(decode_int4)
local h100 = lab.roofline{bytes = decode_fp16.bytes, flops = decode_fp16.flops, device = "H100"}.seconds
    / lab.roofline{bytes = decode_int4.bytes, flops = decode_int4.flops, device = "H100"}.seconds
-- The premise is that fp16 decode is limited by bytes. W4A16 raises the
-- intensity about 3.5 times, which on a CPU with a low ridge can put it at
-- or just past the ridge; the roofline time (the larger of the byte time and
-- the arithmetic time) already accounts for that, so the INT4 side is
-- reported, not required to stay below the ridge.
local fp16_memory_bound = decode_fp16.intensity < machine.ridge
local function side_of_ridge(intensity)
    return intensity < machine.ridge and "below" or "at or above"
end
local activations = int4:info().activations -- what the kernels multiply the codes with
local math_in_float = activations == "bf16" or activations == "fp32"
local decode_wins = bytes_ratio >= 3 and fp16_memory_bound and math_in_float and projected > 1.5
local evidence = string.format("decode of small, per token: weights read %.1f MiB fp16 vs %.1f MiB W4A16 (x%.1f fewer); "
    .. "intensity %.1f FLOP/B fp16 (%s the ridge %.1f) and %.1f W4A16 (%s it); W4A16 activations %s; roofline time x%.1f "
    .. "faster here, x%.1f on an H100; measured CPU %.2f vs %.2f ms/token",
    decode_fp16.weight_bytes / 8 / 2 ^ 20, decode_int4.weight_bytes / 8 / 2 ^ 20, bytes_ratio, decode_fp16.intensity,
    side_of_ridge(decode_fp16.intensity), machine.ridge, decode_int4.intensity, side_of_ridge(decode_int4.intensity),
    activations, projected, h100, decode_fp16.cpu_seconds / 8 * 1e3, decode_int4.cpu_seconds / 8 * 1e3)

if lab.full then
    -- The memory-bound case, measured: the medium preset does not fit any cache.
    local medium = lab.model("medium")
    local medium_int4 = lab.quantize_model(medium, "w4a16")
    local m16 = lab.time{model = medium, phase = "decode", tokens = 8, repeats = 3, threads = 1}
    local m4 = lab.time{model = medium_int4, phase = "decode", tokens = 8, repeats = 3, threads = 1}
    local measured = m16.cpu_seconds / m4.cpu_seconds
    decode_wins = decode_wins and measured > 1.3
    evidence = evidence .. string.format("; medium measured: %.1f vs %.1f ms/token CPU (x%.2f faster with INT4)",
        m16.cpu_seconds / 8 * 1e3, m4.cpu_seconds / 8 * 1e3, measured)
end
lab.check{
    id = "why2",
    claim = "INT4 weights speed up decode although the math runs in higher precision",
    bank_answer = true,
    verdict = decode_wins,
    evidence = evidence,
}
lab.pause()

lab.check{
    id = "recall1",
    claim = "quantization wins on decode (fewer bytes) and risks prefill (extra dequantization work)",
    bank_answer = true,
    verdict = decode_wins and prefill_ratio >= 0.95,
    evidence = string.format("decode: x%.1f fewer weight bytes, roofline x%.1f faster; prefill: x%.2f the fp16 time",
        bytes_ratio, projected, prefill_ratio),
}
