-- 05 Quantization basics: the step size s, the zero-point z, rounding and
-- clipping, symmetric vs asymmetric, and how fine the scales are.
--
--   asymmetric: s = (r_max - r_min) / (2^b - 1), z = round(-r_min / s), q = clamp(round(r / s) + z)
--   symmetric:  s = max|r| / (2^(b-1) - 1), z = 0
--   r_hat = s (q - z)
lab.lesson{
    title = "Quantization basics: s, z, rounding, clipping, symmetric, granularity",
    claims = {"se5", "edge2", "edge3", "edge4", "why3", "tf5", "tf7", "se6"},
}

local model = lab.model("small")
local tensor = "layers.0.wq" -- (384, 384), with the synthetic outlier input channels

-- se5: the sign of the zero-point. Range [-1, 3] at 4 bits.
local zp = lab.quantize{values = {-1, 0, 3}, bits = 4, range = {-1, 3}}
local wrong = math.floor(-1 / zp.s + 0.5) -- round(r_min / s)
local right = math.floor(1 / zp.s + 0.5)  -- round(-r_min / s)
lab.check{
    id = "se5",
    claim = "the zero-point is z = round(r_min / s)",
    bank_answer = false,
    verdict = zp.z == wrong,
    evidence = string.format("range [-1, 3], 4 bits: s = %.4f, the quantizer's z = %d; round(r_min/s) = %d, round(-r_min/s) = %d; "
        .. "0.0 -> q = %d -> r_hat = %g", zp.s, zp.z, wrong, right, zp.q[2], zp.r_hat[2]),
}
lab.pause()

-- edge2, edge3, edge4 on the range [-1, 14] at 4 bits: s = 1 and z = 1, so
-- the levels are the integers -1 .. 14.
local values = {2.5, 7.5, 2.4, 1000, -1000}
local q = lab.quantize{values = values, bits = 4, range = {-1, 14}}
local err = {}
for i, r in ipairs(values) do err[i] = math.abs(r - q.r_hat[i]) end
lab.check{
    id = "edge2",
    claim = "a weight exactly halfway between two levels has the largest rounding error, s/2",
    bank_answer = true,
    verdict = err[1] == q.s / 2 and err[2] == q.s / 2 and err[3] < q.s / 2,
    evidence = string.format("s = %g: 2.5 -> %g (error %g), 7.5 -> %g (error %g), 2.4 -> %g (error %g)",
        q.s, q.r_hat[1], err[1], q.r_hat[2], err[2], q.r_hat[3], err[3]),
}
lab.check{
    id = "edge3",
    claim = "a value far above r_max saturates at the top code 2^b - 1 and decodes to r_max",
    bank_answer = true,
    verdict = q.q[4] == 2 ^ 4 - 1 and q.r_hat[4] == q.r_max,
    evidence = string.format("1000 with range [%g, %g]: q = %d (top code %d), r_hat = %g; %d values clipped",
        q.r_min, q.r_max, q.q[4], q.q_max, q.r_hat[4], q.clipped),
}
lab.check{
    id = "edge4",
    claim = "a value far below r_min saturates at code 0 and decodes to s(0 - z) = r_min",
    bank_answer = true,
    verdict = q.q[5] == 0 and q.r_hat[5] == q.r_min,
    evidence = string.format("-1000: q = %d, r_hat = s(0 - z) = %g x (0 - %d) = %g = r_min", q.q[5], q.s, q.z, q.r_hat[5]),
}
lab.pause()

-- why3: rounding bounds the error of in-range values by s/2; clipping
-- saturates what falls outside instead of wrapping around (what 16.4 would
-- become if its code were simply kept in 4 bits); and choosing a clipped
-- range on a tensor with outliers lowers the error of everything else.
local real = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor"}
local clipped = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor", clip = true}
local edge = lab.quantize{values = {16.4}, bits = 4, range = {-1, 14}}
local unclamped = math.floor(16.4 / edge.s + 0.5) + edge.z
local wrapped_code = unclamped % 16
local wrapped = edge.s * (wrapped_code - edge.z)
lab.check{
    id = "why3",
    claim = "quantization needs both rounding (error <= s/2 in range) and clipping (saturate outliers)",
    bank_answer = true,
    verdict = real.within_half_step and math.abs(16.4 - edge.r_hat[1]) < math.abs(16.4 - wrapped)
        and clipped.mse < real.mse,
    evidence = string.format("%s 4-bit: every in-range error <= s/2: %s (max %.4f, s/2 = %.4f); 16.4 saturates to %g "
        .. "(error %.1f) where a wrapped code %d gives %g (error %.1f); a clipped range: MSE %.3g vs %.3g, %d values clipped",
        tensor, tostring(real.within_half_step), real.max_error, real.s / 2, edge.r_hat[1], math.abs(16.4 - edge.r_hat[1]),
        wrapped_code, wrapped, math.abs(16.4 - wrapped), clipped.mse, real.mse, clipped.clipped),
}
lab.pause()

-- tf5: symmetric vs asymmetric on zero-centred values (each value and its
-- negative), on lopsided values (all positive, like ReLU outputs), and in
-- bytes (a symmetric matrix stores no zero-points).
local centred, lopsided = {}, {}
for i = 1, 2048 do
    local v = math.sin(i * 12.9898) * math.cos(i * 78.233)
    centred[2 * i - 1], centred[2 * i] = v, -v
    lopsided[i] = math.abs(v)
end
local c_sym = lab.quantize{values = centred, bits = 8, symmetric = true}
local c_asym = lab.quantize{values = centred, bits = 8, symmetric = false}
local l_sym = lab.quantize{values = lopsided, bits = 8, symmetric = true}
local l_asym = lab.quantize{values = lopsided, bits = 8, symmetric = false}
local b_sym = lab.quantize{model = model, tensor = tensor, bits = 4, symmetric = true, granularity = "group", group_size = 64}
local b_asym = lab.quantize{model = model, tensor = tensor, bits = 4, symmetric = false, granularity = "group", group_size = 64}
lab.check{
    id = "tf5",
    claim = "symmetric quantization is strictly worse than asymmetric",
    bank_answer = false,
    verdict = c_sym.mse > c_asym.mse * 1.05 and b_sym.packed_bytes >= b_asym.packed_bytes,
    evidence = string.format("zero-centred values: MSE sym %.3g vs asym %.3g (x%.3f, though sym has one level fewer); lopsided values: "
        .. "x%.2f worse; packed 4-bit g64 %s: sym %d bytes vs asym %d (no zero-points)",
        c_sym.mse, c_asym.mse, c_sym.mse / c_asym.mse, l_sym.mse / l_asym.mse, tensor, b_sym.packed_bytes, b_asym.packed_bytes),
}

-- tf7: INT4 against INT8 on the same tensor (per channel, asymmetric).
local int8 = lab.quantize{model = model, tensor = tensor, bits = 8, granularity = "channel"}
local int4 = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "channel"}
lab.check{
    id = "tf7",
    claim = "INT4 has exactly twice the error of INT8",
    bank_answer = false,
    verdict = int4.mse / int8.mse >= 1.5 and int4.mse / int8.mse <= 2.5,
    evidence = string.format("%s per channel: mean s %.4g (INT8, %d levels) vs %.4g (INT4, %d levels), x%.1f; MSE x%.0f; "
        .. "max error x%.1f", tensor, int8.scale_mean, int8.levels, int4.scale_mean, int4.levels,
        int4.scale_mean / int8.scale_mean, int4.mse / int8.mse, int4.max_error / int8.max_error),
}
lab.pause()

-- se6: how many (s, z) pairs, and the error they give.
local per_tensor = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor"}
local per_channel = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "channel"}
lab.check{
    id = "se6",
    claim = "per-tensor quantization is finer-grained than per-channel",
    bank_answer = false,
    verdict = per_tensor.sets > per_channel.sets or per_tensor.mse < per_channel.mse,
    evidence = string.format("%s 4-bit: per tensor %d scale, MSE %.3g; per channel %d scales, MSE %.3g",
        tensor, per_tensor.sets, per_tensor.mse, per_channel.sets, per_channel.mse),
}
