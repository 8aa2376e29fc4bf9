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

lab.say("Arithmetic intensity is a step's FLOPs divided by the bytes it moved, both counted by the kernels. A "
    .. "machine's ridge is its peak FLOP/s over its bandwidth: a step below the ridge waits for memory, one above it "
    .. "for arithmetic.")
local machine = lab.machine()
lab.say(string.format("This machine: %.1f GB/s stream read, %.0f GFLOP/s fp16 matmul: ridge %.1f FLOP/byte.",
    machine.bandwidth / 1e9, machine.peak_flops / 1e9, machine.ridge))
for _, d in ipairs(lab.devices()) do
    lab.say(string.format("  %-16s %6.0f GB/s %6.0f TFLOP/s  ridge %.0f FLOP/byte", d.name, d.bandwidth / 1e9,
        d.peak_flops / 1e12, d.ridge))
end
lab.pause()

local model = lab.model(lab.full and "medium" or "small")
local shape = model:info()
local prompt = lab.full and 512 or 128
local DECODE_STEPS, DECODE_CONTEXT = 8, 16
local prefill = lab.time{model = model, phase = "prefill", tokens = prompt, repeats = 3, threads = 1}
local decode = lab.time{model = model, phase = "decode", tokens = DECODE_STEPS, context = DECODE_CONTEXT, repeats = 3,
    threads = 1}
local decode_step_s = decode.cpu_seconds / DECODE_STEPS
local prefill_token_s = prefill.cpu_seconds / prompt
lab.say(string.format("%s: a %d-token prefill and %d decode steps after a %d-token prompt, one thread, CPU time, "
    .. "median of 3.", shape.name, prompt, DECODE_STEPS, DECODE_CONTEXT))
local h100_decode = lab.roofline{bytes = decode.bytes / DECODE_STEPS, flops = decode.flops / DECODE_STEPS, device = "H100"}

-- The intensity is only as good as its two counts, so each is first held
-- to what the model's shapes say it must be.
-- Bytes: a decode step streams every weight once (the matrices, the norms,
-- the classifier, one embedding row): model:info().decode_weight_bytes.
local decode_weights_per_step = decode.weight_bytes / DECODE_STEPS
local weights_once = decode_weights_per_step / shape.decode_weight_bytes
-- FLOPs: attention does q.k and p.v, 2 x 2 FLOPs per head dimension, per
-- head, layer and context position. Decode step i (1..8) attends over
-- DECODE_CONTEXT + i positions; prefill row p over p positions.
local attention_per_position = 4 * shape.n_layers * shape.n_heads * shape.head_dim
local decode_positions = DECODE_STEPS * DECODE_CONTEXT + DECODE_STEPS * (DECODE_STEPS + 1) / 2
local prefill_positions = prompt * (prompt + 1) / 2
local decode_attention_ratio = decode.attention_flops / (attention_per_position * decode_positions)
local prefill_attention_ratio = prefill.attention_flops / (attention_per_position * prefill_positions)
lab.say(string.format("First the counts, against the model's shapes: a decode step read x%.3f of the model's %.2f MiB "
    .. "of weights, and the attention FLOPs are x%.3f (decode) and x%.3f (prefill) of 4 x layers x heads x head_dim "
    .. "x positions attended.", weights_once, shape.decode_weight_bytes / 2^20, decode_attention_ratio,
    prefill_attention_ratio))
local counts_match_shapes = math.abs(weights_once - 1) < 0.01 and math.abs(decode_attention_ratio - 1) < 0.005
    and math.abs(prefill_attention_ratio - 1) < 0.005

-- Why the two phases differ: decode multiplies each weight it streams by
-- one row (2 FLOPs per weight, about 1 FLOP per byte in fp16); a prompt's
-- rows share one read of each weight, so prefill does about `prompt` times
-- the matmul FLOPs per weight byte. An engine that ran the prompt one row at
-- a time would read the weights once per row and keep decode's ratio.
local decode_reuse = decode.matmul_flops / decode.weight_bytes
local prefill_reuse = prefill.matmul_flops / prefill.weight_bytes
local prompt_shares_weights = prefill_reuse > 0.9 * prompt * decode_reuse
lab.say(string.format("Watch the FLOPs per weight byte: decode multiplies each weight it streams by one row, %.2f "
    .. "FLOP/byte; the prefill's %d rows can share each read: %.1f FLOP/byte measured. Intensity of the whole step: decode %.2f, "
    .. "prefill %.1f, against this machine's ridge %.1f.", decode_reuse, prompt, prefill_reuse, decode.intensity,
    prefill.intensity, machine.ridge))

-- The roofline verdict, from counts and the machine profile. Each side of
-- the ridge is judged against the ridge's band (its peak over bandwidth
-- across the 75th to 90th percentiles of 101 repeats: 5.85 to 7.17 FLOP/B
-- measured at a load of 8 on the shared 2-core machine), so a verdict
-- cannot turn on where in its band the machine happened to be; an
-- intensity inside the band is UNDECIDED, not a guess. The profile is
-- cached (servelab machine), so every lesson of a run judges against the
-- same machine: measured per lesson, its ridge ran from 1.8 to 10.3.
local decode_below = decode.intensity < machine.ridge_low
local prefill_above = prefill.intensity > machine.ridge_high
local on_wrong_side = decode.intensity > machine.ridge_high or prefill.intensity < machine.ridge_low
-- The time the roofline predicts from the counts: max(bytes / bandwidth,
-- FLOPs / peak) per step, at the profile's medians. A memory-bound decode
-- step streams every weight for one token; a compute-bound prefill shares
-- each read among its rows, so a decode token costs several prefill rows
-- (an engine without weight reuse gives x1; 2 is the line between). The
-- CPU times are evidence beside it: one thread against a profile measured
-- on every core, and stretched by whatever else runs (x3.8 measured when
-- written, a single low sample read x1.9 once under ASan).
local function roofline_seconds(t, steps)
    local r = lab.roofline{bytes = t.bytes / steps, flops = t.flops / steps, device = "machine"}
    return r.seconds
end
local predicted_decode_token_s = roofline_seconds(decode, DECODE_STEPS)
local predicted_prefill_token_s = roofline_seconds(prefill, 1) / prompt
local predicted_ratio = predicted_decode_token_s / predicted_prefill_token_s
local decode_costlier_per_token = predicted_ratio > 2
lab.say(string.format("What the roofline predicts per token from those counts: a decode step %.3f ms, a prefill "
    .. "row %.4f ms (x%.1f). Measured, one thread, CPU time: %.2f ms and %.3f ms (x%.1f). On an H100 a decode step "
    .. "would be %s-bound (intensity %.1f, ridge %.0f).", predicted_decode_token_s * 1e3,
    predicted_prefill_token_s * 1e3, predicted_ratio, decode_step_s * 1e3, prefill_token_s * 1e3,
    decode_step_s / prefill_token_s, h100_decode.bound, h100_decode.intensity, h100_decode.ridge))

-- Achieved rates: decode's bytes per second against the bandwidth, prefill's
-- FLOPs per second against the peak (one thread here, so both fall short).
local decode_bandwidth = decode.bytes / decode.cpu_seconds
local prefill_rate = prefill.flops / prefill.cpu_seconds
local counted_ok = counts_match_shapes and prompt_shares_weights and decode_costlier_per_token
local verdict -- true, false, or lab.UNDECIDED when an intensity lies inside the ridge's band
if not counted_ok or on_wrong_side then
    verdict = false
elseif decode_below and prefill_above then
    verdict = true
else
    verdict = lab.UNDECIDED
end
-- The evidence opens with the result in words: the finding, or what broke it.
local findings = {}
if not counts_match_shapes then findings[#findings + 1] = "the counts are not the shapes' (see below)" end
if not prompt_shares_weights then findings[#findings + 1] = "the prompt's rows do not share the weight reads" end
if on_wrong_side then findings[#findings + 1] = "decode and prefill are not on either side of the ridge" end
if not decode_costlier_per_token then
    findings[#findings + 1] = "the roofline gives a decode token no more time than a prefill row"
end
local opening = verdict == true and "decode below the ridge, prefill above it"
    or verdict == lab.UNDECIDED and "noisy machine: an intensity lies inside the ridge's measured band (servelab "
        .. "machine --remeasure on a quiet machine)"
    or table.concat(findings, "; ")
lab.check{
    id = "why1",
    claim = "decode is memory-bound and prefill compute-bound (intensity against the ridge point)",
    bank_answer = true,
    verdict = verdict,
    breaks_with = {"unbatched-decode", "weight-count-doubled", "flops-allocated", "skip-last-block"},
    evidence = string.format("%s: %s decode %.2f FLOP/B, prefill of %d tokens %.1f FLOP/B, ridge %.1f (%.1f..%.1f over "
        .. "the profile's band: %.1f GB/s, %.0f GFLOP/s, 90th percentiles of %d, measured %.1f h ago); prefill does %.1f matmul "
        .. "FLOP per weight byte, decode %.2f (x%.0f for %d rows); per token the roofline gives decode %.3f ms vs prefill "
        .. "%.4f ms (x%.1f; measured CPU, one thread, evidence only: %.2f vs %.3f ms, x%.1f); counts against the "
        .. "shapes: weights per decode step x%.3f of the model's %.2f MiB, attention FLOPs x%.3f (decode) and x%.3f "
        .. "(prefill) of 4 x layers x heads x head_dim x context; decode moves %.1f GB/s, prefill computes %.1f GFLOP/s; "
        .. "on an H100 a decode step would be %s-bound (%.1f vs ridge %.0f)",
        opening, shape.name, decode.intensity, prompt, prefill.intensity, machine.ridge, machine.ridge_low,
        machine.ridge_high, machine.bandwidth / 1e9, machine.peak_flops / 1e9, machine.repeats, machine.age_s / 3600,
        prefill_reuse, decode_reuse, prefill_reuse / decode_reuse, prompt, predicted_decode_token_s * 1e3,
        predicted_prefill_token_s * 1e3, predicted_ratio, decode_step_s * 1e3, prefill_token_s * 1e3,
        decode_step_s / prefill_token_s, weights_once, shape.decode_weight_bytes / 2^20, decode_attention_ratio,
        prefill_attention_ratio, decode_bandwidth / 1e9, prefill_rate / 1e9, h100_decode.bound, h100_decode.intensity,
        h100_decode.ridge),
}
