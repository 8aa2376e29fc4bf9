-- 10 Memory pressure: what a paged engine does when its KV pool runs out.
-- Cached prefixes are evicted least recently used first; a running
-- sequence is preempted (the one admitted last) and later recomputed from
-- its tokens, with the same result as if it had never stopped; and chunked
-- prefill keeps a long prompt from stalling the requests already decoding.
--
-- The question bank says nothing about any of this, so every claim here is
-- the lesson's own (lab.check's expected), and each is held to something
-- the engine does not compute: the lesson's own order of events, the
-- reference forward pass (lab.reference_logits), or a FLOP count worked
-- out from the model's shapes.
lab.lesson{
    title = "Memory pressure: eviction, preemption and chunked prefill",
    claims = {"lru-eviction", "preempt-victim", "recompute-ref", "chunk-stall"},
}

-- fp32 weights and an fp32 KV cache: the engine and the reference forward
-- pass then agree to 0 on this model (lessons/README.md), so greedy tokens
-- can be compared one for one.
local model = lab.model{model = "tiny", dtype = "fp32"}
local shape = model:info()
local BLOCK_SIZE = 16

-- ---- 1. eviction: the least recently used prefix goes first -----------------------------

lab.say("A pool of 7 blocks of 16 tokens. Each request is a 32-token prefix (two full blocks, which the prefix "
    .. "cache keeps after the request ends) and an 8-token question of its own. The lesson keeps its own list of "
    .. "when each prefix was last used.")

local POOL_BLOCKS = 7
local cache_engine = lab.engine{model = model, block_size = BLOCK_SIZE, num_blocks = POOL_BLOCKS, kv_dtype = "fp32",
    watermark_blocks = 1}

-- A 32-token prefix that shares no token with another `first`.
local function prefix_ids(first)
    local ids = {}
    for i = 1, 2 * BLOCK_SIZE do ids[i] = (first * 41 + i * 7) % 250 + 3 end
    return ids
end

-- Each prefix's first id; the rest follow from it (prefix_ids).
local FIRST_ID = {A = 1, B = 2, C = 3, D = 4}
local clock, last_used, prefix_blocks = 0, {}, {}
-- Serves one request on prefix `name` to its end. Returns the tokens the
-- prefix cache supplied and the blocks evicted while it ran; notes the
-- blocks holding the prefix and when the lesson last used it.
local function serve(name, question)
    local ids = prefix_ids(FIRST_ID[name])
    for i = 1, 8 do ids[#ids + 1] = (question * 13 + i) % 250 + 3 end
    local id = cache_engine:add{ids = ids, max_tokens = 2}
    local hit_tokens, evicted = 0, {}
    while cache_engine:has_work() do
        local r = cache_engine:step()
        hit_tokens = hit_tokens + r.prefix_hit_tokens
        for _, event in ipairs(r.events) do
            if event.kind == "evict" then evicted[#evicted + 1] = event.block end
        end
        for _, s in ipairs(r.sequences) do
            if s.id == id and #s.block_table >= 2 then prefix_blocks[name] = {s.block_table[1], s.block_table[2]} end
        end
    end
    clock = clock + 1
    last_used[name] = clock
    return hit_tokens, evicted
end

local function least_recently_used(names)
    local oldest
    for _, name in ipairs(names) do
        if not oldest or last_used[name] < last_used[oldest] then oldest = name end
    end
    return oldest
end

serve("A", 1)
serve("B", 2)
serve("C", 3)
local a_hit = serve("A", 4) -- A again: now the most recently used
local pool = cache_engine:pool()
lab.say(string.format("After A, B, C and A again: %d blocks cached, %d free. The lesson's order, oldest first: %s.",
    pool.blocks_cached, pool.blocks_free, (function()
        local names = {"A", "B", "C"}
        table.sort(names, function(x, y) return last_used[x] < last_used[y] end)
        return table.concat(names, ", ")
    end)()))
-- The prediction, from the lesson's own list: D needs 3 blocks with 1 free,
-- so the two blocks of the least recently used prefix must go.
local predicted = least_recently_used{"A", "B", "C"}
local predicted_blocks = prefix_blocks[predicted]
local used_before_d = {A = last_used.A, B = last_used.B, C = last_used.C}
local _, d_evicted = serve("D", 5)
table.sort(d_evicted)
local expected_blocks = {predicted_blocks[1], predicted_blocks[2]}
table.sort(expected_blocks)
local evicted_as_predicted = #d_evicted == 2 and d_evicted[1] == expected_blocks[1] and d_evicted[2] == expected_blocks[2]
-- Re-requests: the most recently used of the old prefixes must still hit,
-- the evicted one must miss. The kept one goes first, so that nothing it
-- does can evict the one the claim is about.
local kept = "A"
local kept_hit = serve(kept, 6)
local evicted_hit = serve(predicted, 7)
lab.say(string.format("D evicted blocks {%s}; the lesson predicted %s's blocks {%d, %d}. A re-request of %s found %d "
    .. "tokens cached, one of %s found %d.", table.concat(d_evicted, ", "), predicted, predicted_blocks[1],
    predicted_blocks[2], kept, kept_hit, predicted, evicted_hit))
lab.pause()

local lru_holds = a_hit == 2 * BLOCK_SIZE and evicted_as_predicted and kept_hit == 2 * BLOCK_SIZE and evicted_hit == 0
lab.check{
    id = "lru-eviction",
    claim = "a full pool evicts the least recently used cached prefix: a re-request of it misses, one of a prefix used "
        .. "since hits",
    expected = true,
    verdict = lru_holds,
    evidence = string.format("%s: %d blocks; order of last use (the lesson's) A %d, B %d, C %d before D; D evicted "
        .. "{%s}, predicted %s's {%d, %d}; re-request of %s: %d cached tokens (expected %d), of %s: %d (expected 0)",
        lru_holds and "the least recently used prefix went, the others stayed" or "not the least recently used",
        POOL_BLOCKS, used_before_d.A, used_before_d.B, used_before_d.C, table.concat(d_evicted, ", "),
        predicted, predicted_blocks[1], predicted_blocks[2], kept, kept_hit, 2 * BLOCK_SIZE, predicted, evicted_hit),
    breaks_with = {"evict-most-recent", "prefix-no-refcount"},
}
cache_engine:close()

-- ---- 2. preemption: the last admitted goes, and comes back unchanged ----------------------

lab.say("Three requests, each a prompt of 17 to 19 tokens and 40 generated, on a pool of 9 blocks: near the end "
    .. "each needs 4 blocks, 12 in all, so one must give its blocks back (preemption by recompute) and compute its "
    .. "tokens again once there is room.")

local prompts = {"Once upon a time", "The little dog ran", "A bird sang in the"}
local busy = lab.engine{model = model, block_size = BLOCK_SIZE, num_blocks = 9, kv_dtype = "fp32", watermark_blocks = 1}
local ids = {}
for i, prompt in ipairs(prompts) do ids[i] = busy:add{prompt = prompt, max_tokens = 40} end

-- The lesson's own admission order: the step each sequence first ran in,
-- then the order it was added (the queue is first come, first served).
local admitted_at, admission = {}, {}
local victims, preempt_step, preempt_record, counters_before = {}, nil, nil, {}
while busy:has_work() do
    for _, id in ipairs(ids) do counters_before[id] = busy:sequence(id).preemptions end
    local r = busy:step()
    for _, id in ipairs(ids) do
        for _, s in ipairs(r.sequences) do
            if s.id == id and not admitted_at[id] then
                admitted_at[id] = r.step
                admission[#admission + 1] = id
            end
        end
    end
    if r.preempted > 0 and not preempt_step then
        preempt_step, preempt_record = r.step, r
        for _, id in ipairs(ids) do
            local s = busy:sequence(id)
            if s.preemptions > counters_before[id] then victims[#victims + 1] = {id = id, state = s.state} end
        end
    end
end
local expected_victim = admission[#admission]
local victim = victims[1]
local totals = busy:totals()
local victim_seq = victim and busy:sequence(victim.id)
lab.say(string.format("Admitted in the order %s. At step %s the pool ran out: the engine preempted %s; the lesson "
    .. "expected %d, the one admitted last. %d preemption(s) in all.", table.concat(admission, ", "),
    tostring(preempt_step), victim and tostring(victim.id) or "nothing", expected_victim, totals.preemptions))

local victim_right = preempt_step ~= nil and #victims == 1 and victim.id == expected_victim
    and victim.state == "preempted" and preempt_record.preempted == 1 and totals.preemptions >= 1
    and victim_seq.preemptions >= 1
lab.check{
    id = "preempt-victim",
    claim = "when the pool runs out, the running sequence admitted last is preempted, and its preemption counters move",
    expected = true,
    verdict = victim_right,
    evidence = string.format("%s: admitted (the lesson's order) %s; at step %s the step record counts %s preempted, "
        .. "the sequences whose counter moved: %s (state %s); expected %d; engine total preemptions %d",
        victim_right and "the last admitted went" or "not the last admitted", table.concat(admission, ", "),
        tostring(preempt_step), preempt_record and tostring(preempt_record.preempted) or "none",
        victim and tostring(victim.id) or "none", victim and victim.state or "-", expected_victim, totals.preemptions),
    breaks_with = {"preempt-oldest"},
}
lab.pause()

-- The reference's greedy tokens: the largest logit after the tokens so far,
-- one token at a time, from the prompt alone.
local function reference_greedy(prompt_ids, n_total)
    local tokens = {}
    for i, t in ipairs(prompt_ids) do tokens[i] = t end
    while #tokens < n_total do
        local logits = lab.reference_logits{model = model, tokens = tokens}
        local best = 1
        for i = 2, #logits do
            if logits[i] > logits[best] then best = i end
        end
        tokens[#tokens + 1] = best - 1 -- token ids count from 0
    end
    return tokens
end

local matching, first_difference, victim_compared = 0, nil, false
for _, id in ipairs(ids) do
    local s = busy:sequence(id)
    local prompt_ids = {}
    for i = 1, s.n_prompt do prompt_ids[i] = s.tokens[i] end
    local reference = reference_greedy(prompt_ids, s.n_prompt + 40)
    local same = #s.tokens == #reference
    for i = 1, math.max(#s.tokens, #reference) do
        if s.tokens[i] ~= reference[i] then
            same = false
            first_difference = first_difference or string.format("sequence %d at token %d: engine %s, reference %s", id,
                i, tostring(s.tokens[i]), tostring(reference[i]))
            break
        end
    end
    if same then matching = matching + 1 end
    if victim and id == victim.id then victim_compared = same end
end
local recompute_right = victim ~= nil and victim_compared and matching == #ids
lab.say(string.format("After the recompute, %d of %d sequences hold exactly the reference's greedy tokens "
    .. "(40 generated each)%s.", matching, #ids, first_difference and "; first difference: " .. first_difference or ""))
lab.check{
    id = "recompute-ref",
    claim = "a sequence preempted and recomputed generates the same tokens as the reference forward pass run alone",
    expected = true,
    verdict = recompute_right,
    evidence = string.format("%s: %d of %d sequences equal the reference's greedy continuation (%d prompt + 40 "
        .. "tokens), the preempted one (%s) %s%s",
        recompute_right and "the recompute changed nothing" or "the recomputed tokens are not the reference's",
        matching, #ids, victim_seq and victim_seq.n_prompt or 0, victim and tostring(victim.id) or "none",
        victim_compared and "included" or "not equal", first_difference and "; " .. first_difference or ""),
    breaks_with = {"recompute-extra-token", "paged-wrong-slot", "skip-last-block", "prefix-no-refcount"},
}
busy:close()
lab.pause()

-- ---- 3. chunked prefill bounds the decode stall ------------------------------------------

-- Matmul FLOPs from the shapes: per token, every layer's q, k, v, o and the
-- three FFN matrices, 2 FLOPs per weight; per row that wants logits, the
-- classifier. The stall is counted in these, never in seconds.
local per_token_flops = 2 * shape.n_layers * (2 * shape.dim * shape.dim + 2 * shape.dim * shape.kv_dim
    + 3 * shape.dim * shape.hidden_dim)
local per_logit_row_flops = 2 * shape.dim * shape.vocab_size
local BUDGET = 32
local LONG_PROMPT = 200

local function long_prompt_beside_decodes(chunked)
    local e = lab.engine{model = model, block_size = BLOCK_SIZE, num_blocks = 64, kv_dtype = "fp32",
        chunked_prefill = chunked, max_batched_tokens = BUDGET}
    local decoders = {}
    for i, prompt in ipairs(prompts) do decoders[i] = e:add{prompt = prompt, max_tokens = 60} end
    for _ = 1, 4 do e:step() end -- the three are decoding now
    local long = {1}
    for i = 2, LONG_PROMPT do long[i] = (i * 37) % 250 + 3 end
    local long_id = e:add{ids = long, max_tokens = 2}
    local result = {steps = 0, largest = 0, largest_flops = 0, decode_flops = nil, every_decoder_served = true,
        flops_as_shapes = true, prefilled = 0, config_budget = e:config().max_batched_tokens}
    while e:has_work() and result.prefilled < LONG_PROMPT do
        local r = e:step()
        local tokens = r.prefill_tokens + r.decode_tokens
        result.prefilled = result.prefilled + r.prefill_tokens
        local logit_rows = r.decode_tokens + (result.prefilled == LONG_PROMPT and 1 or 0)
        local formula = per_token_flops * tokens + per_logit_row_flops * logit_rows
        result.flops_as_shapes = result.flops_as_shapes and r.flops.matmul == formula
        result.steps = result.steps + 1
        if tokens > result.largest then result.largest, result.largest_flops = tokens, formula end
        -- Each decoder must have run in this step, as a decode.
        local served = 0
        for _, s in ipairs(r.sequences) do
            for _, id in ipairs(decoders) do
                if s.id == id and s.phase == "decode" then served = served + 1 end
            end
        end
        result.every_decoder_served = result.every_decoder_served and served == #decoders
    end
    -- One decode-only step, for scale.
    local r = e:step()
    result.decode_flops = per_token_flops * r.decode_tokens + per_logit_row_flops * r.decode_tokens
    result.decode_tokens = r.decode_tokens
    e:close()
    result.long_id = long_id
    return result
end

local chunked = long_prompt_beside_decodes(true)
local whole = long_prompt_beside_decodes(false)
lab.say(string.format("A %d-token prompt arrives while 3 requests decode. With chunked prefill (a budget of %d "
    .. "tokens per step) it takes %d steps, none over %d tokens (%.1f MFLOP, x%.0f a decode-only step), and the three "
    .. "get a token in every one. Without chunking one step carries %d tokens (%.1f MFLOP, x%.0f): every decode "
    .. "waits for the whole prompt.", LONG_PROMPT, BUDGET, chunked.steps, chunked.largest, chunked.largest_flops / 1e6,
    chunked.largest_flops / chunked.decode_flops, whole.largest, whole.largest_flops / 1e6,
    whole.largest_flops / whole.decode_flops))

local bounded = chunked.largest <= BUDGET and chunked.every_decoder_served and chunked.prefilled == LONG_PROMPT
    and chunked.steps >= math.ceil(LONG_PROMPT / BUDGET)
local unchunked_stalls = whole.largest >= LONG_PROMPT + 3 and whole.every_decoder_served
local counted_right = chunked.flops_as_shapes and whole.flops_as_shapes
local stall_right = bounded and unchunked_stalls and counted_right
lab.check{
    id = "chunk-stall",
    claim = "chunked prefill bounds the decode stall: while a long prompt prefills, every step stays within the token "
        .. "budget and the running decodes get a token in each; without chunking one step carries the whole prompt",
    expected = true,
    verdict = stall_right,
    evidence = string.format("%s: %d-token prompt beside 3 decodes; chunked (budget %d): %d steps, the largest %d "
        .. "tokens = %.2f MFLOP from the shapes (a decode-only step %.2f), decoders served every step: %s; unchunked "
        .. "(budget raised to %d): the largest step %d tokens = %.2f MFLOP (x%.0f a decode step); engine matmul FLOPs "
        .. "equal the shape formula in every step: %s",
        not counted_right and "the counted FLOPs are not the shapes'" or not bounded and "a step went over the budget "
        .. "or a decode waited" or not unchunked_stalls and "the unchunked engine did not carry the prompt in one step"
        or "every step within the budget, every decode served", LONG_PROMPT, BUDGET, chunked.steps, chunked.largest,
        chunked.largest_flops / 1e6, chunked.decode_flops / 1e6, tostring(chunked.every_decoder_served),
        whole.config_budget, whole.largest, whole.largest_flops / 1e6, whole.largest_flops / whole.decode_flops,
        tostring(counted_right)),
    breaks_with = {"chunk-ignores-budget"},
}
