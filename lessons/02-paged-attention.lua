-- 02 PagedAttention: where the KV memory lives, and what that changes (the
-- waste) and does not change (the math).
lab.lesson{
    title = "PagedAttention: same math, less waste, and the block size trade-off",
    claims = {"tf1", "se7", "se8", "edge1", "edge7", "tf6"},
}

-- The tiny preset (2 layers, d_model 64, at most 256 tokens) in fp32. "The
-- same math" is checked against the reference forward pass
-- (lab.reference_logits: the model's math written again apart from the
-- engine, one sequence at a time in a contiguous cache), not paged against
-- contiguous: both layouts run the engine's one forward pass, and a bug in
-- it would be in both.
local model = lab.model{model = "tiny", dtype = "fp32"}
lab.say("Twelve requests of different lengths run twice on the tiny model in fp32: once with a paged cache (blocks "
    .. "of 16 slots taken as tokens arrive), once with a contiguous cache that reserves each request's maximum "
    .. "length (256 slots). Both get the same 1024 slots.")

-- Twelve requests of different lengths, the same in every engine.
local function add_requests(e, count)
    local ids = {}
    for i = 1, count do
        local prompt = {1}
        for k = 1, 10 + (i * 7) % 31 do prompt[#prompt + 1] = 3 + (i * 37 + k * 11) % 250 end
        ids[i] = e:add{ids = prompt, max_tokens = 5 + (i * 13) % 27}
    end
    return ids
end

-- These engines keep their KV in fp16, so the reference rounds its own
-- cache to fp16 too. The two then attend over the same stored values,
-- except where inputs a few fp32 bits apart round to neighbouring fp16
-- values: one fp16 step, 2^-11 of an element, is the bound
-- (tests/engine/test_reference_forward.c measured 1.1e-4 on this model).
local REFERENCE_BOUND = 2 ^ -11
-- The largest difference between sequence `id`'s last logits and the
-- reference's on the same tokens, over the reference's largest logit.
local function from_reference(e, id)
    local logits, position = e:logits(id)
    local tokens, ids = e:sequence(id).tokens, {}
    for i = 1, position + 1 do ids[i] = tokens[i] end
    return lab.logits_difference(logits, lab.reference_logits{model = model, tokens = ids, kv_dtype = "fp16"})
end

-- Runs an engine to the end; returns its totals, per request how far the
-- logits its first sequence last sampled from are from the reference's
-- (relative), and the most empty slots any one
-- decoding sequence held after a step (its table's slots past its context;
-- a prompt still in chunks holds blocks for the tokens it has yet to compute).
local function run(e, ids)
    local block_size = e:config().block_size
    local max_tail_waste = 0
    e:run{stop_when = function(r)
        for _, s in ipairs(r.sequences) do
            if s.phase == "decode" and #s.block_table > 0 then -- a finished one has handed its table back
                max_tail_waste = math.max(max_tail_waste, #s.block_table * block_size - s.context)
            end
        end
        return false
    end}
    local differences = {}
    for i, id in ipairs(ids) do differences[i] = from_reference(e, id) end
    return e:totals(), differences, max_tail_waste
end

-- The same budget of 1024 token slots for both layouts.
local paged = lab.engine{model = model, kv = "paged", block_size = 16, num_blocks = 64}
local contiguous = lab.engine{model = model, kv = "contiguous", block_size = 16, num_blocks = 64, reserve = "max"}
local paged_totals, paged_differences, paged_max_tail = run(paged, add_requests(paged, 12))
local contiguous_totals, contiguous_differences = run(contiguous, add_requests(contiguous, 12))

-- tf1: the attention FLOPs counted by the kernels, and the logits. The
-- claim is false exactly when both layouts do the same math: the same
-- FLOPs, and every request's logits within one fp16 step of the
-- reference's, paged and contiguous.
local identical, differing, largest_difference = true, 0, 0
for i = 1, #paged_differences do
    local worst = math.max(paged_differences[i], contiguous_differences[i])
    largest_difference = math.max(largest_difference, worst)
    if worst > REFERENCE_BOUND then differing = differing + 1 end
end
identical = differing == 0
lab.say(string.format("Paged: %d steps, up to %d requests at once; contiguous: %d steps, up to %d at once, since "
    .. "%d reservations of 256 slots fill the 1024.", paged_totals.steps, paged_totals.peak_running,
    contiguous_totals.steps, contiguous_totals.peak_running, 1024 // 256))
lab.say(string.format("Same math? The kernels counted %d attention FLOPs paged and %d contiguous, and %d of 12 "
    .. "requests ended, in both layouts, with logits within one fp16 step (%.3g) of the reference forward pass "
    .. "(largest relative difference %.3g).", paged_totals.flops.attention, contiguous_totals.flops.attention,
    12 - differing, REFERENCE_BOUND, largest_difference))
local same_flops = paged_totals.flops.attention == contiguous_totals.flops.attention
local same_math = same_flops and identical
lab.check{
    id = "tf1",
    claim = "PagedAttention makes the attention math use fewer FLOPs",
    bank_answer = false,
    verdict = not same_math,
    evidence = string.format("%s: 12 requests, attention FLOPs paged %d, contiguous %d (%s); matmul FLOPs %d vs %d; "
        .. "final logits within 2^-11 of the reference forward pass, paged and contiguous, for %d of 12 requests "
        .. "(largest relative difference %.3g)",
        same_math and "the same math" or "not the same math", paged_totals.flops.attention,
        contiguous_totals.flops.attention, same_flops and "equal" or "different", paged_totals.flops.matmul,
        contiguous_totals.flops.matmul, 12 - differing, largest_difference),
    breaks_with = {"paged-wrong-slot", "skip-last-block", "flops-allocated"},
}
lab.pause()

-- se7: waste left with paging: each sequence's tail, never a whole block.
lab.say(string.format("Paging still wastes slots: a sequence's last block is partly empty. Watch the bound: at most "
    .. "block_size - 1 = 15 empty slots per sequence; measured at most %d. Mean waste over the steps: paged %.1f%%, "
    .. "contiguous %.1f%%.", paged_max_tail, paged_totals.waste_pct, contiguous_totals.waste_pct))
local tail_bounded = paged_max_tail <= 15
local some_waste = paged_totals.waste_pct > 0
lab.check{
    id = "se7",
    claim = "PagedAttention removes all KV memory waste",
    bank_answer = false,
    verdict = not (some_waste and tail_bounded),
    evidence = string.format("%s: paged, the most empty slots one sequence held after a step: %d (the bound is "
        .. "block_size - 1 = 15); mean waste over the steps (allocated but empty slots / allocated) paged %.1f%%, "
        .. "contiguous %.1f%%",
        tail_bounded and "waste left, only in tail blocks" or "more waste than a tail block", paged_max_tail,
        paged_totals.waste_pct, contiguous_totals.waste_pct),
    breaks_with = {"paged-allocate-ahead"},
}

-- se8: contiguous waste comes from reserving the maximum length, not from
-- attention's cost: reserving only what each request needs does the same
-- attention work and wastes far less.
local oracle = lab.engine{model = model, kv = "contiguous", block_size = 16, num_blocks = 64, reserve = "request"}
local oracle_totals = run(oracle, add_requests(oracle, 12))
lab.say(string.format("Why does the contiguous cache waste so much? A third engine reserves only what each request "
    .. "will use (prompt + max_tokens). Attention FLOPs: %d reserving the maximum, %d reserving the request, %d paged; "
    .. "waste %.1f%%, %.1f%%, %.1f%%: the waste follows what is reserved ahead, the attention work does not move.",
    contiguous_totals.flops.attention, oracle_totals.flops.attention, paged_totals.flops.attention,
    contiguous_totals.waste_pct, oracle_totals.waste_pct, paged_totals.waste_pct))
-- Three memory policies (reserve the max, reserve the request, page): the
-- attention work must be the same in all three, while the waste follows
-- how much each one holds ahead of the tokens.
local same_attention = oracle_totals.flops.attention == contiguous_totals.flops.attention
    and paged_totals.flops.attention == contiguous_totals.flops.attention
local waste_follows_reservation = oracle_totals.waste_pct < 0.5 * contiguous_totals.waste_pct
lab.check{
    id = "se8",
    claim = "a naive (contiguous) cache fragments memory because attention costs O(t^2)",
    bank_answer = false,
    verdict = not (same_attention and waste_follows_reservation),
    evidence = string.format("%s: attention FLOPs %d reserving max_seq_len, %d reserving prompt+max_tokens, %d paged "
        .. "(%s); waste %.1f%%, %.1f%%, %.1f%%",
        (same_attention and waste_follows_reservation) and "the waste follows the reservation, not attention"
            or "the waste does not follow the reservation alone",
        contiguous_totals.flops.attention, oracle_totals.flops.attention, paged_totals.flops.attention,
        same_attention and "equal" or "different", contiguous_totals.waste_pct, oracle_totals.waste_pct,
        paged_totals.waste_pct),
    breaks_with = {"reserve-request-length", "flops-allocated", "skip-last-block"},
}
lab.pause()

-- edge1: a sequence whose length is an exact multiple of block_size.
lab.say("One sequence grows from a 30-token prompt to 36 tokens in blocks of 16. Watch the empty slots in its "
    .. "blocks after each step: the formula (16 - length mod 16) mod 16 says 2, 1, 0 at 32, then 15, 14, ...")
local e = lab.engine{model = model, block_size = 16, num_blocks = 16}
local prompt = {1}
for k = 1, 29 do prompt[#prompt + 1] = 3 + k end
e:add{ids = prompt, max_tokens = 8}
local waste_at = {} -- length -> empty slots in the sequence's blocks
e:run{stop_when = function(r)
    local s = r.sequences[1]
    if #s.block_table > 0 then waste_at[s.context] = #s.block_table * 16 - s.context end
    return false
end}
-- Every length from the prompt's 30 to 36 tokens (at 37 it finishes and
-- hands its blocks back): the empty slots must be exactly
-- (16 - length mod 16) mod 16, which is 0 only at 32.
local exact, lengths = true, {}
for length = 30, 36 do
    local expected = (16 - length % 16) % 16
    exact = exact and waste_at[length] == expected
    lengths[#lengths + 1] = string.format("%d: %s", length, tostring(waste_at[length]))
end
lab.say("Measured empty slots by length: " .. table.concat(lengths, ", ") .. ".")
lab.check{
    id = "edge1",
    claim = "a sequence whose length is an exact multiple of block_size has no tail waste",
    bank_answer = true,
    verdict = exact and waste_at[32] == 0,
    evidence = string.format("%s: block_size 16, empty slots in the sequence's blocks at length %s",
        exact and "none at 32, (16 - length mod 16) mod 16 elsewhere" or "not the tail formula",
        table.concat(lengths, ", ")),
    breaks_with = {"paged-allocate-ahead"},
}
lab.pause()

-- edge7: block_size 1. Sixty-four sequences decode side by side, so their
-- blocks interleave in the pool: with block_size 1 every token of a
-- sequence sits in its own block, its table has one entry per token, and
-- the attention kernel gathers scattered slots. The time is the process's
-- CPU time (os.clock) with one thread for the whole decode steps (the
-- engine: scheduling, block tables, the kernels); the lab has no timer for
-- one kernel alone. The attention FLOPs are counted too: they must be equal
-- at both block sizes, so whatever the time shows is not more arithmetic.
-- Measured x1.5 (145 against 95 ms) on 2 shared Zen cores.
lab.say("Block size 1, the other extreme: 64 sequences decode side by side from length 128, once with blocks of 1 "
    .. "slot and once with blocks of 16, in turns. Watch the table entries per sequence and the CPU time of the "
    .. "decode steps.")
local model_fp16 = lab.model("tiny") -- fp16 weights: cheap matmuls, attention matters
local function decode_at_block_size(block_size)
    local engine = lab.engine{model = model_fp16, block_size = block_size, num_blocks = 32768 // block_size,
        max_batched_tokens = 8192, prefix_caching = false, threads = 1}
    for i = 1, 64 do
        engine:add{ids = {1, 3 + i, 4 + i, 5 + i}, max_tokens = 240}
    end
    engine:run{stop_when = function(r) return r.sequences[1].context >= 128 end}
    local max_waste, entries, attention_flops = 0, 0, 0
    local start = os.clock()
    engine:run{stop_when = function(r)
        attention_flops = attention_flops + r.flops.attention
        for _, s in ipairs(r.sequences) do
            max_waste = math.max(max_waste, #s.block_table * block_size - s.context)
            entries = math.max(entries, #s.block_table)
        end
        return false
    end}
    local cpu = os.clock() - start
    engine:close()
    return cpu, max_waste, entries, attention_flops
end
-- Rounds interleaved, the order turning each round, so that a busy
-- neighbour weighs on both block sizes alike; the ratio of each round's
-- pair is judged by its interval (9 rounds: the 2nd from each end, at 96%).
local ROUNDS = 9
local runs = {[1] = {}, [16] = {}}
local waste_1, entries_1, flops_1, waste_16, entries_16, flops_16
for round = 1, ROUNDS do
    local order = round % 2 == 1 and {1, 16} or {16, 1}
    for _, block_size in ipairs(order) do
        if block_size == 1 then
            runs[1][round], waste_1, entries_1, flops_1 = decode_at_block_size(1)
        else
            runs[16][round], waste_16, entries_16, flops_16 = decode_at_block_size(16)
        end
    end
end
local time_1, time_16 = lab.median(runs[1]), lab.median(runs[16])
local slower = lab.ratio_interval(runs[1], runs[16]) -- block 1 / block 16 CPU time
local counted_ok = waste_1 == 0 and entries_1 > entries_16 and flops_1 == flops_16
local slowest -- true, false or lab.UNDECIDED
if not counted_ok or slower.high < 1.0 then
    slowest = false
elseif slower.low > 1.1 then
    slowest = true
else
    slowest = lab.UNDECIDED
end
lab.say(string.format("Block 1: %d empty slots at most, %d table entries per sequence, %.0f ms of CPU (median of %d). "
    .. "Block 16: up to %d empty slots, %d entries, %.0f ms. The same %d attention FLOPs in both, so the x%.2f is the "
    .. "engine gathering and tracking one block per token, not more math.", waste_1, entries_1, time_1 * 1e3, ROUNDS,
    waste_16, entries_16, time_16 * 1e3, flops_1, slower.median))
lab.check{
    id = "edge7",
    claim = "block_size = 1 gives no tail waste, the largest block tables and the slowest decode steps",
    bank_answer = true,
    verdict = slowest,
    breaks_with = {"paged-allocate-ahead", "skip-last-block", "flops-allocated"},
    evidence = (slowest == lab.UNDECIDED and "noisy machine: the interval straddles x1.0..x1.1: " or "")
        .. string.format("64 sequences decoding from length 128: block 1: max tail waste %d slots, %d table entries per "
        .. "sequence, %.0f ms CPU (median of %d rounds); block 16: waste up to %d, %d entries, %.0f ms CPU; block 1 / "
        .. "block 16 time x%.2f (x%.2f..x%.2f at %.0f%%); attention FLOPs %d and %d (%s)", waste_1, entries_1,
        time_1 * 1e3, ROUNDS, waste_16, entries_16, time_16 * 1e3, slower.median, slower.low, slower.high,
        slower.confidence * 100, flops_1, flops_16, flops_1 == flops_16 and "equal" or "different"),
    note = "the bank speaks of the kernel's efficiency; the lab times whole decode steps (one engine thread), "
        .. "in which the attention kernel does the same FLOPs at both block sizes",
}
lab.pause()

-- tf6: the largest block size. Same pool bytes (4096 slots), 48 short requests.
local function serve_with_block_size(block_size)
    local engine = lab.engine{model = model, block_size = block_size, num_blocks = 4096 // block_size}
    local totals, _, max_tail = run(engine, add_requests(engine, 48))
    engine:close()
    totals.max_tail = max_tail
    return totals
end
lab.say("And the largest block, 256 slots: 48 short requests in the same 4096 slots, with blocks of 16 and of 256.")
local with_16, with_256 = serve_with_block_size(16), serve_with_block_size(256)
lab.say(string.format("Block 16 wastes %.1f%% and runs up to %d requests at once; block 256 wastes %.1f%% and runs "
    .. "up to %d, so it needs %d steps where block 16 needs %d. Fewer table entries do not pay for the empty tails.",
    with_16.waste_pct, with_16.peak_running, with_256.waste_pct, with_256.peak_running, with_256.steps, with_16.steps))
-- Why the large block loses: a sequence can leave up to block_size - 1 slots
-- of its last block empty, so 256-slot blocks waste more and fit fewer
-- sequences in the same slots. Both halves are measured.
local tails_bounded = with_16.max_tail <= 15 and with_256.max_tail <= 255
local large_costs_more = with_256.waste_pct > with_16.waste_pct and with_256.peak_running < with_16.peak_running
lab.check{
    id = "tf6",
    claim = "the largest block size is best (least bookkeeping)",
    bank_answer = false,
    verdict = not (large_costs_more and tails_bounded),
    evidence = string.format("%s: 48 requests, 4096 slots: block 16 wastes %.1f%% (at most %d slots per sequence), "
        .. "runs up to %d at once, %d steps; block 256 wastes %.1f%% (up to %d per sequence), runs up to %d at once, "
        .. "%d steps",
        (large_costs_more and tails_bounded) and "the large block wastes its tails and runs fewer at once"
            or "the large block does not cost what its tails should",
        with_16.waste_pct, with_16.max_tail, with_16.peak_running, with_16.steps, with_256.waste_pct,
        with_256.max_tail, with_256.peak_running, with_256.steps),
    breaks_with = {"paged-allocate-ahead"},
}
