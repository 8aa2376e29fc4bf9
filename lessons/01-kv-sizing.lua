-- 01 KV cache sizing: how many bytes the cache holds, measured by the
-- kernels that write it, against the formula 2 x B x S x L x d x p.
lab.lesson{
    title = "KV cache sizing: the factor 2, the width d, linear growth, S = 1",
    claims = {"tf3", "se1", "se2", "edge8", "kv-int8-bytes", "kv-int8-logits"},
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
lab.pause()

-- Two claims of the lesson's own (the bank says nothing of int8 KV): what
-- an int8 cache costs in bytes, and what it costs in accuracy. Each head of
-- each token stores d_head int8 values and one fp32 scale (max|x| / 127),
-- for K and for V in every layer, so p is not 1 byte but 1 + 4 / d_head,
-- and the ratio to fp16 is (d_head + 4) / (2 x d_head) = 0.5 + 2 / d_head.
local int8_element = 1
local scale_bytes = 4
local prompt = {}
for i = 1, S do prompt[i] = 1 + (i * 37) % 250 end
-- Blocks of 16: 131 tokens leave a tail block of 3, where a slot written
-- or read one off shows (with blocks of 1 slot neither paged fault turned
-- the logits). The 128 prompt slots fill 8 blocks exactly, so the pool
-- still holds just what was written.
local function prefill_with(kv_dtype)
    local e = lab.engine{model = model, kv_dtype = kv_dtype, block_size = 16, num_blocks = 64}
    local id = e:add{ids = prompt, max_tokens = 8} -- still running after the steps: its KV stays in the pool
    local r = e:step()
    local result = {written = r.bytes.kv_written, pool = r.slots_used * e:pool().bytes_per_slot,
        prefill = r.prefill_tokens}
    -- Three decode steps more, so the logits come from attention over a
    -- cache the engine wrote and then read back (prefill attends to the
    -- step's own K and V as well).
    for _ = 1, 3 do e:step() end
    local logits, position = e:logits(id)
    local tokens, ids = e:sequence(id).tokens, {}
    for i = 1, position + 1 do ids[i] = tokens[i] end
    result.logits, result.tokens = logits, ids
    e:close()
    return result
end
lab.say(string.format("Now the same %d-token prompt twice more, once with an fp16 cache and once with an int8 cache "
    .. "(kv_dtype = \"int8\"): one byte per value, plus one fp32 scale for every token, layer, K or V, and KV head.", S))
local fp16_kv, int8_kv = prefill_with("fp16"), prefill_with("int8")
local int8_values = 2 * S * shape.n_layers * shape.n_kv_heads * shape.head_dim * int8_element
local int8_scales = 2 * S * shape.n_layers * shape.n_kv_heads * scale_bytes
local int8_closed_form = int8_values + int8_scales
local int8_ratio = int8_kv.written / fp16_kv.written
local ratio_closed_form = 0.5 + 2 / shape.head_dim
lab.say(string.format("int8 wrote %d bytes: %d of values (2 x S x L x n_kv_heads x d_head x 1) and %d of scales "
    .. "(2 x S x L x n_kv_heads x 4). fp16 wrote %d. The ratio is x%.5f, 0.5 + 2/%d = x%.5f: the scales add %d bytes "
    .. "to every %d-byte head, so int8 saves %.1f%%, not 50%%.", int8_kv.written, int8_values, int8_scales,
    fp16_kv.written, int8_ratio, shape.head_dim, ratio_closed_form, scale_bytes, shape.head_dim,
    100 * (1 - int8_ratio)))
local bytes_follow_the_shapes = int8_kv.prefill == S and int8_kv.written == int8_closed_form
    and int8_kv.written == int8_kv.pool and fp16_kv.written == with_two
    and int8_kv.written * 2 * shape.head_dim == fp16_kv.written * (shape.head_dim + scale_bytes)
lab.check{
    id = "kv-int8-bytes",
    claim = "an int8 KV cache takes 0.5 + 2/d_head of the fp16 bytes (values plus one fp32 scale per token and head), "
        .. "not half",
    expected = true,
    verdict = bytes_follow_the_shapes,
    evidence = string.format("%s: S=%d, int8: kernels wrote %d bytes, the pool holds %d; closed form "
        .. "2*S*L*n_kv_heads*(d_head*1 + 4) = %d + %d = %d; fp16 wrote %d (2*S*L*kv_dim*2 = %d); int8/fp16 = x%.5f, "
        .. "0.5 + 2/d_head = x%.5f with d_head = %d",
        bytes_follow_the_shapes and "values and scales, exactly" or "the bytes do not follow the closed form",
        S, int8_kv.written, int8_kv.pool, int8_values, int8_scales, int8_closed_form, fp16_kv.written, with_two,
        int8_ratio, ratio_closed_form, shape.head_dim),
    breaks_with = {"kv-int8-scales-uncounted", "kv-count-dropped", "kv-count-doubled"},
    note = string.format("x%.5f for d_head = %d: a smaller head pays more for its scale (x0.5625 at d_head 32)",
        ratio_closed_form, shape.head_dim),
}

-- The accuracy: the reference forward pass (engine/reference_forward.c),
-- given the same per-token, per-head int8 rounding, must agree with the
-- engine's int8 cache within one int8 step, 1/127 of the largest logit;
-- both must then sit as far from the fp32 reference as int8 rounding puts
-- them (the reference's own int8 distance, within that step).
local int8_step = 1 / 127
local int8_reference = lab.reference_logits{model = model, tokens = int8_kv.tokens, kv_dtype = "int8"}
local fp32_reference = lab.reference_logits{model = model, tokens = int8_kv.tokens}
local to_int8_reference = lab.logits_difference(int8_kv.logits, int8_reference)
local to_fp32_reference = lab.logits_difference(int8_kv.logits, fp32_reference)
local rounding_alone = lab.logits_difference(int8_reference, fp32_reference)
local fp16_to_fp32 = lab.logits_difference(fp16_kv.logits,
    lab.reference_logits{model = model, tokens = fp16_kv.tokens})
lab.say(string.format("Three decode steps later, accuracy, as a share of the largest logit: the int8 engine is %.2g from the reference with the "
    .. "same int8 cache (one int8 step is %.2g) and %.2g from the fp32 reference, where int8 rounding alone puts the "
    .. "reference %.2g away. The fp16 cache is %.2g from fp32: int8 costs about %.0f times more.", to_int8_reference,
    int8_step, to_fp32_reference, rounding_alone, fp16_to_fp32, to_fp32_reference / fp16_to_fp32))
local int8_matches_reference = to_int8_reference <= int8_step
    and math.abs(to_fp32_reference - rounding_alone) <= int8_step
lab.check{
    id = "kv-int8-logits",
    claim = "with an int8 KV cache (per-token, per-head scales) the engine's logits are the reference's with the same "
        .. "rounding, within one int8 step",
    expected = true,
    verdict = int8_matches_reference,
    evidence = string.format("%s: %d tokens (3 decoded), |engine - int8 reference| = %.3g of the largest logit (bound 1/127 = %.3g); "
        .. "|engine - fp32 reference| = %.3g, |int8 reference - fp32 reference| = %.3g (differ by %.2g); "
        .. "fp16 cache: |engine - fp32 reference| = %.3g",
        int8_matches_reference and "the int8 reference's logits, within one step" or "not the reference's logits",
        #int8_kv.tokens, to_int8_reference, int8_step, to_fp32_reference, rounding_alone,
        math.abs(to_fp32_reference - rounding_alone), fp16_to_fp32),
    breaks_with = {"paged-wrong-slot", "skip-last-block"},
}
