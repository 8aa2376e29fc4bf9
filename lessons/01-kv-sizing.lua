-- 01 KV cache sizing: how many bytes the cache holds, measured by the
-- kernels that write it, against the formula 2 x B x S x L x d x p.
lab.lesson{
    title = "KV cache sizing: the factor 2, the width d, linear growth, S = 1",
    claims = {"tf3", "se1", "se2", "edge8"},
}

-- The small preset (9 layers, d_model 384, 6 query heads, 2 KV heads of
-- 64): grouped-query attention, so the cache width is n_kv_heads x d_head
-- = 128, not d_model = 384. fp16 KV: p = 2 bytes.
local model = lab.model("small")
local shape = model:info()
local p = 2
lab.say(string.format("Model: %d layers, d_model %d, %d query heads, %d KV heads of d_head %d (KV width %d), fp16 KV.",
    shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.kv_dim))

-- One sequence grows one token per step. After every step we read the KV
-- bytes the kernels wrote so far (keys and values of every layer) and the
-- attention FLOPs they spent. Block size 1 makes the pool hold exactly the
-- tokens, so the pool's bytes and the written bytes must agree.
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
lab.pause()

-- tf3: doubling S doubles the cache (linear); the quadratic cost is the
-- attention work over all positions, which caching turns into one pass.
local ratio_kv = at[256].written / at[128].written
local ratio_attention = at[256].attention / at[128].attention
lab.say(string.format("S = 128: %d bytes of KV; S = 256: %d bytes (x%.2f). Attention FLOPs summed over the steps: x%.2f.",
    at[128].written, at[256].written, ratio_kv, ratio_attention))
lab.check{
    id = "tf3",
    claim = "the KV cache grows quadratically with sequence length",
    bank_answer = false,
    verdict = ratio_kv > 3.0, -- quadratic growth would give about 4x per doubling
    evidence = string.format("KV bytes written at S=64/128/256: %d / %d / %d (x%.2f per doubling); the pool held %d bytes at S=256; "
        .. "only the summed attention FLOPs grow ~quadratically (x%.2f)",
        at[64].written, at[128].written, at[256].written, ratio_kv, at[256].pool, ratio_attention),
}

-- se1: the formula without its factor 2 (keys AND values).
local S = 128
local measured = at[S].written
local without_two = 1 * S * shape.n_layers * shape.kv_dim * p
local with_two = lab.kv_bytes{model = model, batch = 1, seq = S, bytes_per_element = p}
lab.check{
    id = "se1",
    claim = "KV cache size = B x S x L x d x p (no factor 2)",
    bank_answer = false,
    verdict = measured == without_two,
    evidence = string.format("S=%d: kernels wrote %d bytes; B*S*L*d*p = %d (x%.2f short), 2*B*S*L*d*p = %d",
        S, measured, without_two, measured / without_two, with_two),
}

-- se2: the width in the whole-cache formula. d_head is one head; summed
-- over the heads that store K and V it is n_kv_heads x d_head (= d_model
-- without grouped-query attention; here GQA stores 3x less than d_model).
local with_d_head = 2 * S * shape.n_layers * shape.head_dim * p
local with_d_model = 2 * S * shape.n_layers * shape.dim * p
local with_kv_width = 2 * S * shape.n_layers * shape.n_kv_heads * shape.head_dim * p
lab.check{
    id = "se2",
    claim = "the whole-cache formula uses d_head because attention works per head",
    bank_answer = false,
    verdict = measured == with_d_head,
    evidence = string.format("S=%d: measured %d bytes; with d_head %d (x%.1f short); with d_model %d (x%.1f: without GQA); "
        .. "with n_kv_heads*d_head %d (exact)",
        S, measured, with_d_head, measured / with_d_head, with_d_model, with_d_model / measured, with_kv_width),
}
lab.pause()

-- edge8: the very first step, S = 1, for a batch of 4 one-token prompts.
local batch = 4
local b = lab.engine{model = model, block_size = 1, num_blocks = 64}
for i = 1, batch do b:add{ids = {1}, max_tokens = 8} end -- still running after the step
local first = b:step()
local expected = lab.kv_bytes{model = model, batch = batch, seq = 1, bytes_per_element = p}
lab.check{
    id = "edge8",
    claim = "at S = 1 the cache holds one token per sequence: 2 x B x L x d x p",
    bank_answer = true,
    verdict = first.bytes.kv_written == expected and first.slots_used == batch,
    evidence = string.format("B=%d, S=1: kernels wrote %d bytes into %d slots; 2*B*1*L*d*p = %d",
        batch, first.bytes.kv_written, first.slots_used, expected),
}
