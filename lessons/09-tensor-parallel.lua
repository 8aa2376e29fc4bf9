-- 09 Tensor parallelism: more GPUs, and decode is still memory-bound.
--
-- With --tp N every linear layer is split Megatron-style across N
-- simulated GPUs ("shards"): q/k/v and the FFN's gate and up projections
-- by output rows (whole heads per shard), wo and w2 by input columns, with
-- an all-reduce of the partial sums after each. Every shard counts its own
-- bytes and FLOPs, so we can ask each shard the roofline question on its
-- own: does splitting the weights make a decode step compute-bound?
lab.lesson{
    title = "Tensor parallelism leaves decode memory-bound",
    claims = {"why6"},
}

local model = lab.model(lab.full and "medium" or "small")
local SHARDS = 2

-- The decode steps of one request (prefill steps left out), for an engine
-- built with `fields`.
local function decode_steps(fields)
    fields.model = model
    fields.threads = 1
    local e = lab.engine(fields)
    e:add{prompt = "Once upon a time there was a little", max_tokens = 9}
    local steps = {}
    while e:has_work() do
        local r = e:step()
        if r.prefill_tokens == 0 then steps[#steps + 1] = r end
    end
    e:close()
    return steps
end

local whole = decode_steps{}
local sharded = decode_steps{tp = SHARDS, tp_link = "nvlink"}

-- Per decode step: the unsharded intensity, and each shard's.
local whole_intensity, shard_intensity, shard_weights, shards_weights, allreduce_s, allreduce_bytes = {}, {}, {}, {}, {}, {}
for i, r in ipairs(whole) do whole_intensity[i] = r.intensity end
for i, r in ipairs(sharded) do
    local worst, heaviest, together = 0, 0, 0
    for _, shard in ipairs(r.tp.shard) do
        worst = math.max(worst, shard.intensity)
        heaviest = math.max(heaviest, shard.bytes.weights)
        together = together + shard.bytes.weights
    end
    shard_intensity[i] = worst
    shard_weights[i] = heaviest
    shards_weights[i] = together
    allreduce_s[i] = r.tp.allreduce_s
    allreduce_bytes[i] = r.tp.allreduce_bytes
end
local unsharded_weights = whole[1].bytes.weights
local step = sharded[1]
lab.say(string.format("%s, %d decode steps: unsharded %.2f FLOP/byte; with %d shards the busiest shard %.2f FLOP/byte "
    .. "and streams %.2f MiB of weights per step (the unsharded step %.2f MiB).", model:info().name, #sharded,
    lab.median(whole_intensity), SHARDS, lab.median(shard_intensity), lab.median(shard_weights) / 2^20,
    unsharded_weights / 2^20))
lab.pause()

-- The roofline of one shard's step on an H100 (with its NVLink all-reduces)
-- and on this machine.
local machine = lab.machine()
local h100
for _, d in ipairs(lab.devices()) do
    if d.name:find("H100") then h100 = d end
end
local shard = step.tp.shard[1]
local on_h100 = lab.roofline{bytes = shard.bytes.total, flops = shard.flops.total, device = h100.name}
local memory_bound_everywhere = lab.median(shard_intensity) < h100.ridge and lab.median(shard_intensity) < machine.ridge
-- Splitting divides FLOPs and bytes alike, so a shard's intensity stays
-- about what the whole step had; it does not climb towards the ridge.
local intensity_kept = lab.median(shard_intensity) < 1.5 * lab.median(whole_intensity)
-- The bytes behind that: the unsharded step streams the model once (its
-- decode_weight_bytes), the shards together stream no more than that (each
-- its own slice; the classifier and embedding stay outside the shards), and
-- the busiest shard about 1/N of it (heads and hidden features split evenly:
-- 13.50 of 27.22 MiB for small at tp 2; 5% allows an uneven hidden split).
-- A shard handed the full matrices streams far more (23.6 MiB at tp 2).
local model_weights = model:info().decode_weight_bytes
local whole_streams_model = math.abs(unsharded_weights / model_weights - 1) < 0.01
local shards_split_model = lab.median(shards_weights) <= unsharded_weights
    and lab.median(shard_weights) < 1.05 * unsharded_weights / SHARDS and lab.median(shard_weights) > 0
local streams_its_share = whole_streams_model and shards_split_model
local verdict = memory_bound_everywhere and intensity_kept and streams_its_share and on_h100.bound == "memory"
local opening = verdict and "memory-bound on every shard, each streaming 1/" .. SHARDS .. " of the weights"
    or not whole_streams_model and "the weights counted per step are not the model's"
    or not shards_split_model and "the shards do not split the weights"
    or "a shard's step is not memory-bound"
lab.check{
    id = "why6",
    claim = "tensor parallelism leaves decode memory-bound",
    bank_answer = true,
    verdict = verdict,
    breaks_with = {"tp-full-weights", "weight-count-doubled"},
    evidence = string.format("%s: %s, tp %d: the busiest shard streams %.2f MiB of weights per decode step, the shards "
        .. "together %.2f MiB, the unsharded step %.2f MiB (the model's decode weights %.2f MiB); shard intensity %.2f "
        .. "FLOP/B (unsharded %.2f) against ridges %.0f (%s) and %.1f (this machine); on the %s a shard's step is "
        .. "%s-bound (memory %.2f us, compute %.3f us) plus %.1f us for %d all-reduces (%d bytes sent per shard) over %s",
        opening, model:info().name, SHARDS, lab.median(shard_weights) / 2^20, lab.median(shards_weights) / 2^20,
        unsharded_weights / 2^20, model_weights / 2^20, lab.median(shard_intensity), lab.median(whole_intensity),
        h100.ridge, h100.name, machine.ridge, h100.name, on_h100.bound, on_h100.memory_seconds * 1e6,
        on_h100.compute_seconds * 1e6, lab.median(allreduce_s) * 1e6, step.tp.allreduces,
        math.floor(lab.median(allreduce_bytes)), step.tp.link),
}
