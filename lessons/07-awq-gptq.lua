-- 07 4-bit in practice: group scales, outlier channels, AWQ and GPTQ,
-- W8A8, and what a quantized model keeps in memory.
lab.lesson{
    title = "4-bit methods: groups, outliers, AWQ vs GPTQ, W8A8, no fp16 copy",
    claims = {"why4", "se3", "se4", "tf8"},
}

local small = lab.model("small")
local tensor = "layers.0.wq" -- (384 outputs, 384 inputs); a few input channels are 10-20x larger

-- why4 (part 1): one 4-bit scale for the whole tensor is stretched by the
-- outliers; a scale per group of 32 inputs follows the values. At 8 bits
-- the same coarse scale costs far less.
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
lab.check{
    id = "why4",
    claim = "4-bit quantization needs group scales and outlier handling",
    bank_answer = true,
    verdict = t4 > 4 * g4 and awq.output_mse < rtn.output_mse,
    evidence = string.format("%s RMS error / RMS weight at 4 bits: per tensor %.0f%%, per channel %.0f%%, per group of 32 "
        .. "%.0f%% (MSE x%.0f lower); 8 bits per tensor: %.1f%%; with outlier activations the layer's output error: RTN %.3g, "
        .. "AWQ (scales the salient channels) %.3g",
        tensor, relative(t4), relative(c4), relative(g4), t4 / g4, relative(t8), rtn.output_mse, awq.output_mse),
}
lab.pause()

-- se3: which method uses a Hessian? AWQ scales input channels by mean|x|^alpha
-- and then rounds every scaled weight to its nearest level. GPTQ quantizes
-- column by column and pushes each column's error onto the columns not yet
-- quantized through H^-1 (H = 2 X^T X), so many codes end up NOT the nearest
-- level of their weight: that is the Hessian at work.
local n = rtn.rows * rtn.cols
lab.check{
    id = "se3",
    claim = "AWQ minimises the layer's output error with a Hessian",
    bank_answer = false,
    verdict = awq.not_nearest > 0,
    evidence = string.format("codes not at the nearest level: AWQ %d of %d (alpha %.2f on mean|x|), GPTQ %d of %d; output "
        .. "error RTN %.3g, AWQ %.3g, GPTQ %.3g; weight MSE RTN %.3g, GPTQ %.3g",
        awq.not_nearest, n, awq.alpha, gptq.not_nearest, n, rtn.output_mse, awq.output_mse, gptq.output_mse, rtn.mse, gptq.mse),
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
local a, b = first_logits(w8a8), first_logits(w8a16)
local max_difference = 0
for i = 1, #a do max_difference = math.max(max_difference, math.abs(a[i] - b[i])) end
lab.check{
    id = "se4",
    claim = "W8A8 quantizes only the weights (like W4A16, at 8 bits)",
    bank_answer = false,
    verdict = max_difference == 0 and w8a8:info().activation_bits == 0,
    evidence = string.format("same 8-bit weights (%d vs %d bytes): W8A8 runs with %d-bit activations, W8A16 with fp32; "
        .. "their logits differ by up to %.4g", w8a8:info().weight_bytes, w8a16:info().weight_bytes,
        w8a8:info().activation_bits, max_difference),
}
lab.pause()

-- tf8: what a W4A16 model holds, and what its decode reads per token.
local w4, report = lab.quantize_model(tiny, "w4a16")
local t16 = lab.time{model = tiny, phase = "decode", tokens = 4, repeats = 1, threads = 1}
local t4 = lab.time{model = w4, phase = "decode", tokens = 4, repeats = 1, threads = 1}
local held_16, held_4 = tiny:info().weight_bytes, w4:info().weight_bytes
lab.check{
    id = "tf8",
    claim = "a quantized model need not keep an FP16 copy of its weights",
    bank_answer = true,
    verdict = held_4 < 0.5 * held_16 and t4.weight_bytes < 0.5 * t16.weight_bytes,
    evidence = string.format("tiny: fp16 model holds %d weight bytes, W4A16 %d (x%.2f; quantizer report %d -> %d); "
        .. "decode reads %d vs %d weight bytes per token", held_16, held_4, held_4 / held_16, report.weight_bytes_before,
        report.weight_bytes_after, t16.weight_bytes // 4, t4.weight_bytes // 4),
}
