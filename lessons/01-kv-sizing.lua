-- 01 KV cache sizing: how many bytes the cache holds, measured by the
-- kernels that write it, against the formula 2 x B x S x L x d x p.
lab.lesson{
    title = "KV cache sizing: the factor 2, the width d, linear growth, S = 1",
    claims = {"tf3", "se1", "se2", "edge8"},
}

-- The small preset (9 layers, d_model 384, 6 query heads, 2 KV heads of
-- 64): grouped-query attention, so the cache width is n_kv_heads x d_head
-- = 128, not d_model = 384. Its multi-head twin (n_kv_heads = 6, one KV
-- head per query head) stores d_model = 384 per token and layer: the
-- bank's formula 2 x B x S x L x d_model x p is the MHA case. fp16 KV: p = 2.
local model = lab.model("small")
local shape = model:info()
local mha_model = lab.model{model = "small", n_kv_heads = shape.n_heads}
local mha = mha_model:info()
local p = 2
lab.say(string.format("Model: %d layers, d_model %d, %d query heads, %d KV heads of d_head %d (KV width %d), fp16 KV; "
    .. "its multi-head twin has %d KV heads (KV width %d).",
    shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.kv_dim, mha.n_kv_heads, mha.kv_dim))

lab.say("One sequence now grows one token per step, from S = 1 to S = 256. After every step we add up the KV "
    .. "bytes the kernels wrote and the attention FLOPs they spent. Blocks of 1 slot make the pool hold exactly the "
    .. "tokens, so what was written and what is held must agree.")
local e = lab.engine{model = model, block_size = 1, num_blocks = 512}
local id = e:add{ids = {1}, max_tokens = 300} -- more than we run: it stays in the pool
local written, attention = 0, 0
local at = {} -- S -> {kv bytes written so far, attention FLOPs so far, bytes the pool holds}
e:run{stop_when = function(r)
    written = written + r.bytes.kv_written
    attention = attention + r.flops.attention
    local S = r.sequences[1].context
    at[S] = {written = written, attention = attention, pool = r.slots_used * e:pool().bytes_per_slot}
    return S >= 256
end}
lab.say(string.format("Written so far: %d bytes at S = 64, %d at S = 128, %d at S = 256; the pool holds %d, %d, %d.",
    at[64].written, at[128].written, at[256].written, at[64].pool, at[128].pool, at[256].pool))
lab.pause()

-- The multi-head twin, measured at S = 128 in one prefill step: the bytes
-- its kernels wrote, and what its pool holds.
local S = 128
local function prefill_bytes(m, length)
    local e = lab.engine{model = m, block_size = 1, num_blocks = 512}
    local ids = {}
    for i = 1, length do ids[i] = 1 + i % 200 end
    e:add{ids = ids, max_tokens = 8} -- still running after the step: its KV stays in the pool
    local r = e:step()
    local result = {written = r.bytes.kv_written, pool = r.slots_used * e:pool().bytes_per_slot,
        prefill = r.prefill_tokens}
    e:close()
    return result
end
local mha_at = prefill_bytes(mha_model, S)
lab.say(string.format("The multi-head twin reads a %d-token prompt in one step: its kernels write %d bytes of KV, "
    .. "%.0f times the grouped-query model's %d, because it keeps %d KV heads where the other keeps %d.", S,
    mha_at.written, mha_at.written / at[S].written, at[S].written, mha.n_kv_heads, shape.n_kv_heads))

-- tf3: x2 within 1% per doubling, and every byte written is held.
local ratio_kv = at[128].written / at[64].written
local ratio_kv_2 = at[256].written / at[128].written
local ratio_attention = at[256].attention / at[128].attention
local function doubles(ratio) return math.abs(ratio / 2 - 1) <= 0.01 end -- x2 within 1%
local written_is_held = at[64].written == at[64].pool and at[128].written == at[128].pool
    and at[256].written == at[256].pool
local linear = doubles(ratio_kv) and doubles(ratio_kv_2) and written_is_held
lab.say(string.format("Doubling S doubles the cache: x%.2f from 64 to 128, x%.2f from 128 to 256. What grows "
    .. "about fourfold is the attention work summed over the steps (x%.2f): each new token attends to every earlier "
    .. "one, and the cache is what saves recomputing them.", ratio_kv, ratio_kv_2, ratio_attention))
lab.check{
    id = "tf3",
    claim = "the KV cache grows quadratically with sequence length",
    bank_answer = false,
    verdict = not linear,
    evidence = string.format("%s, x%.2f and x%.2f per doubling; KV bytes written at S=64/128/256: %d / %d / %d, "
        .. "bytes the pool holds: %d / %d / %d (%s); only the summed attention FLOPs grow ~quadratically (x%.2f)",
        linear and "linear" or "not linear and held", ratio_kv, ratio_kv_2, at[64].written, at[128].written,
        at[256].written, at[64].pool, at[128].pool, at[256].pool, written_is_held and "equal" or "different",
        ratio_attention),
    breaks_with = {"kv-count-dropped", "kv-count-doubled"},
}

-- se1: the formula without its factor 2 (keys AND values). Each model's
-- bytes must equal 2 x B x S x L x (its KV width) x p exactly.
local measured = at[S].written
local with_two = 2 * S * shape.n_layers * shape.kv_dim * p
local without_two = S * shape.n_layers * shape.kv_dim * p
local mha_with_two = 2 * S * mha.n_layers * mha.dim * p
lab.say(string.format("The formula 2 x B x S x L x d x p at S = %d: with the factor 2 (keys and values) %d bytes, "
    .. "without it %d; the kernels wrote %d. The bank's d is d_model; this model's cache stores kv_dim = %d per "
    .. "token and layer, and its multi-head twin d_model = %d.", S, with_two, without_two, measured, shape.kv_dim,
    mha.dim))
local factor_two_holds = measured == with_two and mha_at.prefill == S and mha_at.written == mha_with_two
    and mha_at.written == mha_at.pool
lab.check{
    id = "se1",
    claim = "KV cache size = B x S x L x d x p (no factor 2)",
    bank_answer = false,
    verdict = not factor_two_holds,
    evidence = string.format("%s: S=%d, GQA: kernels wrote %d bytes, 2*B*S*L*kv_dim*p = %d, without the 2 %d; "
        .. "multi-head twin: wrote %d (its pool holds %d), 2*B*S*L*d_model*p = %d",
        factor_two_holds and "the factor 2 (K and V) holds exactly" or "the bytes do not match 2*B*S*L*d*p",
        S, measured, with_two, without_two, mha_at.written, mha_at.pool, mha_with_two),
    breaks_with = {"kv-count-dropped", "kv-count-doubled"},
    note = string.format("the bank's d is d_model, which holds for the multi-head twin only; this GQA preset stores "
        .. "kv_dim = %d per token and layer, %dx less than d_model", shape.kv_dim, shape.dim // shape.kv_dim),
}

-- se2: the width in the whole-cache formula. d_head is one head; summed
-- over the heads that store K and V it is n_kv_heads x d_head (= d_model
-- without grouped-query attention; here GQA stores 3x less than d_model).
local with_d_head = 2 * S * shape.n_layers * shape.head_dim * p
local with_kv_width = 2 * S * shape.n_layers * shape.n_kv_heads * shape.head_dim * p
local mha_with_d_head = 2 * S * mha.n_layers * mha.head_dim * p
lab.say(string.format("Which width? One head's d_head = %d gives %d bytes, and the kernels wrote x%.0f that; "
    .. "every KV head together, %d x %d, gives %d, the bytes written.", shape.head_dim, with_d_head, measured / with_d_head,
    shape.n_kv_heads, shape.head_dim, with_kv_width))
local width_is_all_kv_heads = measured == with_kv_width and mha_at.written == mha_with_two
lab.check{
    id = "se2",
    claim = "the whole-cache formula uses d_head because attention works per head",
    bank_answer = false,
    verdict = not width_is_all_kv_heads,
    evidence = string.format("%s: S=%d, GQA: measured %d bytes; 2*S*L*n_kv_heads*d_head*p = %d, with d_head alone %d "
        .. "(measured / that = %.2f); multi-head twin: measured %d; 2*S*L*d_model*p = %d, with d_head alone %d "
        .. "(measured / that = %.2f)",
        width_is_all_kv_heads and "the width is every KV head, n_kv_heads*d_head" or "the width is not n_kv_heads*d_head",
        S, measured, with_kv_width, with_d_head, measured / with_d_head, mha_at.written, mha_with_two, mha_with_d_head,
        mha_at.written / mha_with_d_head),
    breaks_with = {"kv-count-dropped", "kv-count-doubled"},
}
lab.pause()

-- edge8: the very first step, S = 1, for a batch of 4 one-token prompts,
-- in both models.
local batch = 4
local function first_step(m)
    local b = lab.engine{model = m, block_size = 1, num_blocks = 64}
    for i = 1, batch do b:add{ids = {1}, max_tokens = 8} end -- still running after the step
    local first = b:step()
    b:close()
    return first
end
lab.say(string.format("Last, the very first step: a batch of %d one-token prompts, S = 1. Watch the slots used: "
    .. "one per sequence.", batch))
local first, mha_first = first_step(model), first_step(mha_model)
local expected = lab.kv_bytes{model = model, batch = batch, seq = 1, bytes_per_element = p}
local mha_expected = 2 * batch * 1 * mha.n_layers * mha.dim * p
lab.say(string.format("The step wrote %d bytes into %d slots (2 x B x 1 x L x kv_dim x p = %d); the twin %d bytes "
    .. "into %d slots (with d_model: %d). The cache starts at one token per sequence and grows from there.",
    first.bytes.kv_written, first.slots_used, expected, mha_first.bytes.kv_written, mha_first.slots_used, mha_expected))
local one_token_each = first.bytes.kv_written == expected and first.slots_used == batch
    and mha_first.bytes.kv_written == mha_expected and mha_first.slots_used == batch
lab.check{
    id = "edge8",
    claim = "at S = 1 the cache holds one token per sequence: 2 x B x L x d x p",
    bank_answer = true,
    verdict = one_token_each,
    evidence = string.format("%s: B=%d, S=1, GQA: kernels wrote %d bytes into %d slots, 2*B*1*L*kv_dim*p = %d; "
        .. "multi-head twin: %d bytes into %d slots, 2*B*1*L*d_model*p = %d",
        one_token_each and "one token per sequence" or "not one token per sequence", batch, first.bytes.kv_written,
        first.slots_used, expected, mha_first.bytes.kv_written, mha_first.slots_used, mha_expected),
    breaks_with = {"kv-count-dropped", "kv-count-doubled"},
    note = "d is the KV width: d_model with multi-head attention, n_kv_heads x d_head with grouped-query attention",
}
