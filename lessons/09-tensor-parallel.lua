-- 09 Tensor parallelism: a shard's decode step stays below the ridge (TP
-- never makes decode compute-bound; why6), and for models this small the
-- all-reduces, not the weight bytes, set the step's time (tp-comm-bound,
-- the lesson's own claim: the bank does not say it).
--
-- With tp = N every linear layer is split Megatron-style across N simulated
-- GPUs ("shards"): q/k/v and the FFN's gate and up projections by output
-- rows (whole heads per shard), wo and w2 by input columns, with an
-- all-reduce of the partial sums after each. Every shard counts its own
-- bytes and FLOPs; the all-reduces are timed on a link model
-- (engine/links.c: NVLink 450 GB/s per direction, 5 us per all-reduce).
lab.lesson{
    title = "Tensor parallelism: shards stay memory-bound, the all-reduces set the pace",
    claims = {"why6", "tp-comm-bound"},
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

lab.say(string.format("One request decodes on %s twice: on one device, then split over %d simulated GPUs joined by "
    .. "NVLink. Each shard counts the bytes and FLOPs of its own slice.", model:info().name, SHARDS))
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
lab.say(string.format("Per decode step the unsharded engine streams %.2f MiB of weights; with %d shards the busiest "
    .. "shard streams %.2f MiB. Watch the intensity: splitting cuts FLOPs and bytes alike, so it stays at %.2f FLOP/byte "
    .. "per shard (unsharded %.2f).", unsharded_weights / 2^20, SHARDS, lab.median(shard_weights) / 2^20,
    lab.median(shard_intensity), lab.median(whole_intensity)))
lab.pause()

-- The roofline of one shard's step on an H100 and on this machine.
local machine = lab.machine()
local h100
for _, d in ipairs(lab.devices()) do
    if d.name:find("H100") then h100 = d end
end
local shape = model:info()
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
local model_weights = shape.decode_weight_bytes
local whole_streams_model = math.abs(unsharded_weights / model_weights - 1) < 0.01
local shards_split_model = lab.median(shards_weights) <= unsharded_weights
    and lab.median(shard_weights) < 1.05 * unsharded_weights / SHARDS and lab.median(shard_weights) > 0
local streams_its_share = whole_streams_model and shards_split_model
lab.say(string.format("On an H100 (ridge %.0f FLOP/byte) one shard's slice would take %.2f us to stream and %.3f us "
    .. "to compute: %s-bound. On this machine the ridge is %.1f FLOP/byte.", h100.ridge,
    on_h100.memory_seconds * 1e6, on_h100.compute_seconds * 1e6, on_h100.bound, machine.ridge))
lab.pause()

-- The communication, held to the shapes: two all-reduces per layer (after
-- wo and after w2), each of one fp32 activation row of d_model values per
-- token, which a ring sends 2 (N - 1) / N times from every shard. The time
-- is the link model's; on NVLink its fixed latency (5 us per all-reduce)
-- outweighs the bytes (1536 bytes take 3.4 ns at 450 GB/s), so for small
-- the 18 all-reduces cost ~90 us against ~4.3 us of streaming: the step is
-- communication-bound, which the bank's "bandwidth stays the bottleneck"
-- does not say.
local predicted_allreduces = 2 * shape.n_layers
local predicted_bytes = predicted_allreduces * 2 * (SHARDS - 1) * shape.dim * 4 // SHARDS
local comm_as_shapes = step.tp.allreduces == predicted_allreduces and step.tp.allreduce_bytes == predicted_bytes
local comm_s = lab.median(allreduce_s)
local stream_s = math.max(on_h100.memory_seconds, on_h100.compute_seconds)
local bound = comm_s > stream_s and "communication" or on_h100.bound
lab.say(string.format("The shards must add their partial sums: %d all-reduces per step (2 per layer, predicted %d), "
    .. "each shard sending %d bytes (predicted %d). Over NVLink they take %.1f us, %.1f us each, against %.2f us of "
    .. "streaming: the sharded step is %s-bound.", step.tp.allreduces, predicted_allreduces, step.tp.allreduce_bytes,
    predicted_bytes, comm_s * 1e6, comm_s / step.tp.allreduces * 1e6, stream_s * 1e6, bound))

local verdict = memory_bound_everywhere and intensity_kept and streams_its_share and on_h100.bound == "memory"
local opening = verdict and string.format("not compute-bound: every shard stays below the ridge, streaming 1/%d of the "
    .. "weights, and the step is %s-bound on the %s", SHARDS, bound, h100.name)
    or not whole_streams_model and "the weights counted per step are not the model's"
    or not shards_split_model and "the shards do not split the weights"
    or "a shard's step is not memory-bound"
lab.check{
    id = "why6",
    claim = "tensor parallelism does not remove decode's memory-bound nature",
    bank_answer = true,
    breaks_with = {"tp-full-weights", "weight-count-doubled"},
    measure = function()
        local evidence = string.format("%s: %s, tp %d: the busiest shard streams %.2f MiB of weights per decode step, "
            .. "the shards together %.2f MiB, the unsharded step %.2f MiB (the model's decode weights %.2f MiB); shard "
            .. "intensity %.2f FLOP/B (unsharded %.2f) against ridges %.0f (%s) and %.1f (this machine); on the %s a "
            .. "shard's step streams for %.2f us and computes for %.3f us, and its %d all-reduces (2 x %d layers; %d "
            .. "bytes sent per shard, 2(N-1)/N x d_model x 4 x %d = %d) take %.1f us over %s",
            opening, shape.name, SHARDS, lab.median(shard_weights) / 2^20, lab.median(shards_weights) / 2^20,
            unsharded_weights / 2^20, model_weights / 2^20, lab.median(shard_intensity), lab.median(whole_intensity),
            h100.ridge, h100.name, machine.ridge, h100.name, on_h100.memory_seconds * 1e6,
            on_h100.compute_seconds * 1e6, step.tp.allreduces, shape.n_layers, step.tp.allreduce_bytes,
            predicted_allreduces, predicted_bytes, comm_s * 1e6, step.tp.link)
        return verdict, evidence
    end,
    note = string.format("the bank names bandwidth as the step's bottleneck; here the modelled all-reduces (%.1f us) "
        .. "take x%.0f the shard's streaming time (%.2f us), so for this model the sharded step is %s-bound", comm_s * 1e6,
        comm_s / stream_s, stream_s * 1e6, bound),
}

-- The communication claim, on its own: the all-reduces counted per step
-- are the shapes' (2 per layer, 2(N-1)/N x d_model x 4 bytes from every
-- shard), and their modelled time exceeds the shard's streaming time. Held
-- to the shapes, not to the engine's own tally: an all-reduce that counts
-- only its reduce-scatter sends (N-1)/N and reads half the bytes.
local comm_bound = comm_as_shapes and comm_s > stream_s
lab.check{
    id = "tp-comm-bound",
    claim = "for a model this small, a tensor-parallel decode step is communication-bound: its all-reduces, counted "
        .. "as the shapes say, take longer than a shard's streaming",
    expected = true,
    verdict = comm_bound,
    evidence = string.format("%s: %s at tp %d over %s: %d all-reduces per step (2 x %d layers: %d), %d bytes sent "
        .. "per shard (2(N-1)/N x d_model x 4 x %d = %d); %.1f us of all-reduces against %.2f us of streaming on the "
        .. "%s (x%.0f)",
        not comm_as_shapes and "the all-reduces counted are not the shapes'"
        or comm_bound and "communication-bound" or "the streaming outlasts the all-reduces",
        shape.name, SHARDS, step.tp.link, step.tp.allreduces, shape.n_layers, predicted_allreduces,
        step.tp.allreduce_bytes, predicted_allreduces, predicted_bytes, comm_s * 1e6, stream_s * 1e6, h100.name,
        comm_s / stream_s),
    breaks_with = {"tp-allreduce-one-way"},
}
