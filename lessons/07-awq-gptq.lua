-- 07 4-bit in practice: group scales, outlier channels, AWQ and GPTQ,
-- W8A8, and what a quantized model keeps in memory.
lab.lesson{
    title = "4-bit methods: groups, outliers, AWQ vs GPTQ, W8A8, no fp16 copy",
    claims = {"why4", "se3", "gptq-feedback", "se4", "tf8"},
}

local small = lab.model("small")
local tensor = "layers.0.wq" -- (384 outputs, 384 inputs); a few input channels are 10-20x larger
lab.say("At 4 bits there are only 16 levels, so where the scale comes from decides the error. This lesson quantizes "
    .. "one matrix of the small model, " .. tensor .. ", whose weights have a few input channels 10 to 20 times larger "
    .. "than the rest, the way real models do.")

-- why4 (part 1): the error per tensor, channel and group of 32, at 4 and 8 bits.
local function mse(bits, granularity, group_size)
    return lab.quantize{model = small, tensor = tensor, bits = bits, granularity = granularity, group_size = group_size}.mse
end
local t4, c4, g4 = mse(4, "tensor"), mse(4, "channel"), mse(4, "group", 32)
local t8 = mse(8, "tensor")
-- The error relative to the weights themselves (RMS error / RMS weight).
local weights = small:tensor(tensor)
local sum = 0
for _, w in ipairs(weights) do sum = sum + w * w end
local rms = math.sqrt(sum / #weights)
local function relative(m) return 100 * math.sqrt(m) / rms end

-- Calibration activations for one layer, made up: 64 tokens of 384 inputs,
-- of which 4 channels are 30x larger (activation outliers, as in real LLMs).
local inputs = {}
for s = 1, 64 do
    local row = {}
    for c = 1, 384 do
        local v = math.sin(s * 12.9898 + c * 78.233) * 2
        if c % 97 == 0 then v = v * 30 end
        row[c] = v
    end
    inputs[s] = row
end
local scheme = {model = small, tensor = tensor, bits = 4, granularity = "group", group_size = 64, inputs = inputs}
local function with(method)
    local args = {}
    for k, v in pairs(scheme) do args[k] = v end
    args.method = method
    return lab.quantize(args)
end
local rtn, awq, gptq = with("rtn"), with("awq"), with("gptq")
lab.say(string.format("Error relative to the weights at 4 bits: one scale for the tensor %.0f%%, one per output "
    .. "channel %.0f%%, one per group of 32 inputs %.0f%%; at 8 bits one scale gives %.1f%%. The outliers stretch a "
    .. "shared scale, and 16 levels cannot afford it.", relative(t4), relative(c4), relative(g4), relative(t8)))
lab.say(string.format("Now the layer's output on 64 made-up tokens whose inputs have 4 channels 30 times larger: "
    .. "rounding to nearest (RTN) gives an output error of %.3g, AWQ %.3g, GPTQ %.3g. Both methods look at the "
    .. "inputs; the next step asks how.", rtn.output_mse, awq.output_mse, gptq.output_mse))
lab.check{
    id = "why4",
    claim = "4-bit quantization needs group scales and outlier handling",
    bank_answer = true,
    breaks_with = {"group-tensor-max", "awq-no-scaling"},
    verdict = t4 > 4 * g4 and rtn.output_mse > 1.5 * awq.output_mse,
    evidence = string.format("%s RMS error / RMS weight at 4 bits: per tensor %.0f%%, per channel %.0f%%, per group of 32 "
        .. "%.0f%% (MSE x%.0f lower); 8 bits per tensor: %.1f%%; with outlier activations the layer's output error: RTN %.3g, "
        .. "AWQ (scales the salient channels) %.3g (x%.1f lower)",
        tensor, relative(t4), relative(c4), relative(g4), t4 / g4, relative(t8), rtn.output_mse, awq.output_mse,
        rtn.output_mse / awq.output_mse),
}
lab.pause()

-- se3: which method uses a Hessian? AWQ learns one number per input channel
-- from the calibration data, s_c = mean|x_c|^alpha (centred so that the
-- largest and smallest scales are reciprocal; alpha from a grid of 21), and
-- then rounds W diag(s) to nearest: only the first moment of each channel
-- enters, never how channels vary together. GPTQ quantizes column by column
-- and pushes each column's error onto the columns not yet quantized through
-- H^-1 (H = 2 X^T X), so many of its codes end up NOT the nearest level of
-- their weight: that is the Hessian at work. The check recomputes AWQ's
-- scales from mean|x| alone and compares them with the ones AWQ chose.
local n = rtn.rows * rtn.cols
local mean_abs = {}
for c = 1, rtn.cols do
    local sum = 0
    for s = 1, #inputs do sum = sum + math.abs(inputs[s][c]) end
    mean_abs[c] = sum / #inputs
end
local predicted, largest, smallest = {}, 0, math.huge
for c = 1, rtn.cols do
    predicted[c] = math.max(mean_abs[c] ^ awq.alpha, 1e-4)
    largest, smallest = math.max(largest, predicted[c]), math.min(smallest, predicted[c])
end
local scale_mismatch = 0 -- largest relative difference between AWQ's scales and mean|x|^alpha
for c = 1, rtn.cols do
    local expected = predicted[c] / math.sqrt(largest * smallest)
    scale_mismatch = math.max(scale_mismatch, math.abs(awq.channel_scales[c] - expected) / expected)
end
local spread = 0 -- largest / smallest of AWQ's scales: 1 when nothing is scaled
do
    local hi, lo = 0, math.huge
    for c = 1, rtn.cols do hi, lo = math.max(hi, awq.channel_scales[c]), math.min(lo, awq.channel_scales[c]) end
    spread = hi / lo
end
lab.say(string.format("AWQ scales each input channel by mean|x|^alpha before rounding (alpha = %.2f here): recomputed "
    .. "from the inputs' first moment alone, its %d scales match to within %.1e, and %d of its %d codes are off the "
    .. "nearest level. GPTQ feeds each column's rounding error into the columns after it through the inverse of "
    .. "H = 2 X^T X, so %d of its %d codes are not the nearest level: that is where a Hessian shows.", awq.alpha,
    rtn.cols, scale_mismatch, awq.not_nearest, n, gptq.not_nearest, n))
lab.check{
    id = "se3",
    claim = "AWQ minimises the layer's output error with a Hessian",
    bank_answer = false,
    breaks_with = {"awq-no-scaling", "gptq-no-feedback"},
    -- What refutes the claim is the two methods looking as they are built:
    -- AWQ's scales are mean|x_c|^alpha (a relative difference under 1e-3,
    -- spread over x2) and every AWQ code is the nearest level of W diag(s),
    -- while GPTQ, which does use H, moves over 1% of its codes off the nearest
    -- level and more than halves RTN's output error. AWQ codes off their
    -- nearest level (over 1%) would say AWQ works as a Hessian method does.
    -- When either method misses its description (awq-no-scaling leaves every
    -- scale 1, gptq-no-feedback leaves every code nearest), the lab cannot
    -- tell a Hessian method from one without: the claim is not refuted, and
    -- the line names the number that missed.
    measure = function()
        local awq_like_hessian = awq.not_nearest > 0.01 * n
        local awq_from_mean_abs = awq.alpha > 0 and spread > 2 and scale_mismatch < 1e-3 and awq.not_nearest == 0
        local gptq_uses_hessian = gptq.not_nearest > 0.01 * n and gptq.output_mse < 0.5 * rtn.output_mse
        local refuted = not awq_like_hessian and awq_from_mean_abs and gptq_uses_hessian
        local finding
        if awq_like_hessian then
            finding = string.format("AWQ moves %d of %d codes off the nearest level, as a Hessian method would",
                awq.not_nearest, n)
        elseif refuted then
            finding = "AWQ uses no Hessian"
        else
            local missed = {}
            if not awq_from_mean_abs then
                missed[#missed + 1] = string.format("AWQ is not mean|x_c|^alpha scaling then nearest rounding "
                    .. "(alpha %.2f, largest relative difference %.1e where under 1e-3 is expected, spread x%.2f where "
                    .. "over x2 is expected, %d codes off the nearest level where 0 is expected)", awq.alpha, scale_mismatch, spread, awq.not_nearest)
            end
            if not gptq_uses_hessian then
                missed[#missed + 1] = string.format("GPTQ shows no Hessian at work (%d of %d codes off the nearest level "
                    .. "where over 1%% is expected, output error %.3g against RTN's %.3g where under half is expected)",
                    gptq.not_nearest, n, gptq.output_mse, rtn.output_mse)
            end
            finding = "not refuted: " .. table.concat(missed, "; ")
        end
        return not refuted, string.format("%s; AWQ: its %d scales are mean|x_c|^%.2f to within %.1e (spread x%.0f) and "
            .. "%d of %d of its codes are not the nearest levels of W diag(s); GPTQ, which uses H = 2 X^T X, leaves %d of %d "
            .. "codes off the nearest level; output error RTN %.3g, AWQ %.3g, GPTQ %.3g; weight MSE RTN %.3g, GPTQ %.3g",
            finding, rtn.cols, awq.alpha, scale_mismatch, spread, awq.not_nearest, n, gptq.not_nearest, n, rtn.output_mse,
            awq.output_mse, gptq.output_mse, rtn.mse, gptq.mse)
    end,
}
lab.pause()
-- gptq-feedback: GPTQ written again in plain Lua, from its definition, on a
-- small made-up layer (8 outputs, 160 inputs: more than the 128 columns the
-- engine updates lazily at once, so its block boundary is crossed; 192
-- calibration tokens, every 37th input 20x larger). Rule: quantize column i
-- of every row, divide the rounding error by U[i][i] and subtract it times
-- U[i][j] from every later column j, where U is the upper Cholesky factor of
-- H^-1 and H = 2 X^T X / tokens + 1% of its mean diagonal (the damping the
-- lab asks for). The scales come from the engine (per output channel, from
-- the untouched weights, as GPTQ takes them); the codes are what is checked.
local GPTQ_ROWS, GPTQ_COLS, GPTQ_TOKENS = 8, 160, 192
local gptq_weights, gptq_inputs = {}, {}
for o = 1, GPTQ_ROWS do
    for c = 1, GPTQ_COLS do
        gptq_weights[(o - 1) * GPTQ_COLS + c] = 0.5 * math.sin(o * 3.7 + c * 1.3) + 0.2 * math.cos(o * c * 0.11)
    end
end
for s = 1, GPTQ_TOKENS do
    local row = {}
    for c = 1, GPTQ_COLS do
        local v = 2 * math.sin(s * 12.9898 + c * 78.233)
        if c % 37 == 0 then v = 20 * v end
        row[c] = v
    end
    gptq_inputs[s] = row
end
local engine_gptq = lab.quantize{values = gptq_weights, rows = GPTQ_ROWS, bits = 4, granularity = "channel",
                                 method = "gptq", inputs = gptq_inputs}
local function lower_cholesky(a, n)
    local l = {}
    for i = 1, n do l[i] = {} for j = 1, n do l[i][j] = 0 end end
    for j = 1, n do
        local pivot = a[j][j]
        for k = 1, j - 1 do pivot = pivot - l[j][k] * l[j][k] end
        l[j][j] = math.sqrt(pivot)
        for i = j + 1, n do
            local sum = a[i][j]
            for k = 1, j - 1 do sum = sum - l[i][k] * l[j][k] end
            l[i][j] = sum / l[j][j]
        end
    end
    return l
end
local function reference_gptq_codes()
    local n = GPTQ_COLS
    local h, diagonal = {}, 0
    for i = 1, n do h[i] = {} end
    for i = 1, n do
        for j = i, n do
            local sum = 0
            for s = 1, GPTQ_TOKENS do sum = sum + gptq_inputs[s][i] * gptq_inputs[s][j] end
            h[i][j], h[j][i] = 2 * sum / GPTQ_TOKENS, 2 * sum / GPTQ_TOKENS
        end
        diagonal = diagonal + h[i][i]
    end
    for i = 1, n do h[i][i] = h[i][i] + 0.01 * diagonal / n end
    -- H^-1 = L^-T L^-1, then its lower Cholesky factor, whose transpose is U.
    local l = lower_cholesky(h, n)
    local inverse_l = {}
    for i = 1, n do inverse_l[i] = {} for j = 1, n do inverse_l[i][j] = 0 end end
    for j = 1, n do
        inverse_l[j][j] = 1 / l[j][j]
        for i = j + 1, n do
            local sum = 0
            for k = j, i - 1 do sum = sum + l[i][k] * inverse_l[k][j] end
            inverse_l[i][j] = -sum / l[i][i]
        end
    end
    local h_inverse = {}
    for i = 1, n do
        h_inverse[i] = {}
        for j = 1, n do
            local sum = 0
            for k = math.max(i, j), n do sum = sum + inverse_l[k][i] * inverse_l[k][j] end
            h_inverse[i][j] = sum
        end
    end
    local u = lower_cholesky(h_inverse, n) -- u[j][i] is U[i][j]
    local function to_float(x) return (string.unpack("f", string.pack("f", x))) end
    local function round_half_away(x) return x >= 0 and math.floor(x + 0.5) or -math.floor(-x + 0.5) end
    local codes = {}
    for o = 1, GPTQ_ROWS do
        local row = {}
        for c = 1, n do row[c] = to_float(gptq_weights[(o - 1) * n + c]) end
        local s, z = engine_gptq.scales[o], engine_gptq.zero_points[o]
        for i = 1, n do
            local q = round_half_away(to_float(row[i]) / s) + z
            q = math.max(engine_gptq.q_min, math.min(engine_gptq.q_max, q))
            codes[(o - 1) * n + i] = q
            local e = (row[i] - to_float(s * (q - z))) / u[i][i]
            for j = i + 1, n do row[j] = row[j] - e * u[j][i] end
        end
    end
    return codes
end
local reference_codes = reference_gptq_codes()
local codes_differing, codes_off_nearest = 0, 0
for k = 1, GPTQ_ROWS * GPTQ_COLS do
    if engine_gptq.q[k] ~= reference_codes[k] then codes_differing = codes_differing + 1 end
end
local codes_follow_the_rule = codes_differing == 0 and engine_gptq.not_nearest > 0
lab.say(string.format("To see that GPTQ's codes come from that rule and nothing else, the lesson runs GPTQ again in "
    .. "plain Lua on a small layer (%d outputs, %d inputs, %d tokens): %d of the engine's %d codes differ from it, and "
    .. "%d are off their nearest level.", GPTQ_ROWS, GPTQ_COLS, GPTQ_TOKENS, codes_differing, GPTQ_ROWS * GPTQ_COLS,
    engine_gptq.not_nearest))
lab.check{
    id = "gptq-feedback",
    claim = "GPTQ's codes are exactly those of its error-feedback rule (each column's rounding error moved onto the "
        .. "later columns through the Cholesky factor of H^-1)",
    expected = true,
    verdict = codes_follow_the_rule,
    evidence = string.format("%s: %d x %d weights, %d calibration tokens, 4 bits per output channel; %d of %d codes "
        .. "differ from the lesson's own GPTQ (H = 2 X^T X / %d + 1%% of its mean diagonal, U from H^-1, columns in "
        .. "order, no blocks); %d codes off their nearest level (0 would mean no feedback at all)",
        codes_follow_the_rule and "the same codes" or "not the rule's codes", GPTQ_ROWS, GPTQ_COLS, GPTQ_TOKENS,
        codes_differing, GPTQ_ROWS * GPTQ_COLS, GPTQ_TOKENS, engine_gptq.not_nearest),
    breaks_with = {"gptq-no-feedback"},
}
lab.pause()
-- se4: W8A8 and W8A16 with the same symmetric per-channel 8-bit weights.
-- If W8A8 quantized only the weights, both would compute the same logits.
local tiny = lab.model("tiny")
local w8a8 = lab.quantize_model(tiny, "w8a8")
local w8a16 = lab.quantize_model(tiny, "w8a16:sym")
local function first_logits(m)
    local e = lab.engine{model = m, num_blocks = 16}
    local id = e:add{prompt = "The cat sat on the", max_tokens = 1}
    e:run()
    local logits = e:logits(id)
    e:close()
    return logits
end
lab.say("W8A8 against W8A16 on the tiny model: the same symmetric 8-bit weights per channel, and the same prompt. "
    .. "If W8A8 only quantized the weights, the two would compute the same logits.")
local a, b = first_logits(w8a8), first_logits(w8a16)
local max_difference, low, high = 0, math.huge, -math.huge
for i = 1, #a do
    max_difference = math.max(max_difference, math.abs(a[i] - b[i]))
    low, high = math.min(low, b[i]), math.max(high, b[i])
end
local logit_range = high - low
lab.say(string.format("Largest difference between their logits: %.4g, %.1f%% of the logits' range; activation bits %d "
    .. "against %d. Any difference at all means W8A8 rounded the activations as well as the weights.", max_difference, 100 * max_difference / logit_range,
    w8a8:info().activation_bits, w8a16:info().activation_bits))
lab.check{
    id = "se4",
    claim = "W8A8 quantizes only the weights (like W4A16, at 8 bits)",
    bank_answer = false,
    breaks_with = {"w8a8-float-activations"},
    measure = function()
        local evidence = string.format("%s: with the same 8-bit weights (%d vs %d bytes) "
            .. "its logits differ from W8A16's by up to %.4g (%.1f%% of their range %.3g), where weights alone would give "
            .. "equal logits; activation bits %d vs %d",
            max_difference > 0 and "W8A8 quantizes the activations too" or "W8A8 computes what W8A16 computes",
            w8a8:info().weight_bytes, w8a16:info().weight_bytes, max_difference, 100 * max_difference / logit_range,
            logit_range, w8a8:info().activation_bits, w8a16:info().activation_bits)
        if max_difference == 0 then return true, evidence end
        -- Per-token 8-bit activations move each logit by a few per cent of the
        -- range, never more: a larger difference would be a broken model.
        local holds = w8a8:info().weight_bytes == w8a16:info().weight_bytes and w8a8:info().activation_bits == 8
            and w8a16:info().activation_bits == 0 and max_difference < 0.1 * logit_range
        if not holds then error("the two models differ in more than their activations: " .. evidence, 0) end
        return false, evidence
    end,
}
lab.pause()

-- tf8: what a W4A16 model holds, and what its decode reads per token. The
-- heap is read before and after the model is loaded and quantized (the bytes
-- really allocated), and the kernels' traffic tally gives the weight bytes
-- one decode step really read.
local w4, report = lab.quantize_model(tiny, "w4a16")
local tokens = 4
local t16 = lab.time{model = tiny, phase = "decode", tokens = tokens, repeats = 1, threads = 1}
local t4 = lab.time{model = w4, phase = "decode", tokens = tokens, repeats = 1, threads = 1}
local held_16, held_4 = report.heap_bytes_before, report.heap_bytes_after
local read_16, read_4 = t16.weight_bytes / tokens, t4.weight_bytes / tokens
lab.say(string.format("Last, memory: the heap grew by %d bytes when the fp16 tiny model was loaded, and holds %d "
    .. "once it is quantized to W4A16. A decode step reads %d weight bytes per token, against %d in fp16. A model that "
    .. "kept an fp16 copy would hold more, and a step that read more than the model holds would be "
    .. "reading a copy.", held_16, held_4,
    read_4, read_16))
lab.check{
    id = "tf8",
    claim = "a quantized model need not keep an FP16 copy of its weights",
    bank_answer = true,
    breaks_with = {"quant-keeps-fp16", "weight-count-doubled"},
    -- Decode streams every matrix once (the embedding shared with the
    -- classifier included), so a step can read at most what the model holds;
    -- it reads a little less here, because the allocation also holds the
    -- model's tokenizer and alignment. A step that read more than the model
    -- holds would be reading another copy, or counting a read twice.
    verdict = held_4 < 0.5 * held_16 and read_4 < 0.5 * read_16 and read_4 <= held_4,
    evidence = string.format("tiny: the heap grew by %d bytes for the fp16 model and holds %d after quantizing to W4A16 "
        .. "(x%.2f; weight_bytes %d -> %d); a decode step read %d weight bytes per token vs %d in fp16 (x%.2f), %.2f times "
        .. "what the W4A16 model holds", held_16, held_4, held_4 / held_16, report.weight_bytes_before,
        report.weight_bytes_after, read_4, read_16, read_4 / read_16, read_4 / held_4),
}
