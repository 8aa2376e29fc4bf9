-- 05 Quantization basics: the step size s, the zero-point z, rounding and
-- clipping, symmetric vs asymmetric, and how fine the scales are (the
-- formulas are in the first lab.say).
--
-- The packed formats store s in fp16, so the quantizer rounds s UP to the
-- next fp16 value (lab.quantize reports that s). Where a check needs exact
-- levels it uses a range whose s is a power of two (exact in fp16); where it
-- uses another range it allows for the rounding (at most 2^-10 of s).
--
-- Each check compares what the quantizer did with what the formulas say
-- holds. When the measurement matches neither the claim nor what holds, the
-- check stops with FAIL and says which number is off.
lab.lesson{
    title = "Quantization basics: s, z, rounding, clipping, symmetric, granularity",
    claims = {"se5", "edge2", "edge3", "edge4", "why3", "tf5", "tf7", "se6"},
}

local model = lab.model("small")
local tensor = "layers.0.wq" -- (384, 384), with the synthetic outlier input channels
lab.say("Quantizing maps each real value r to an integer code q with b bits. Asymmetric: step s = (r_max - r_min) / "
    .. "(2^b - 1), zero-point z = round(-r_min / s), q = clamp(round(r / s) + z); symmetric: s = max|r| / "
    .. "(2^(b-1) - 1), z = 0. Decoding gives r_hat = s (q - z). Each step below quantizes something and compares "
    .. "what came back with these formulas.")

-- round half away from zero, as the quantizer rounds
local function round(x)
    return x >= 0 and math.floor(x + 0.5) or -math.floor(-x + 0.5)
end

-- Rounding to nearest leaves an error spread evenly over [-s/2, s/2]: its
-- mean square is s^2/12. Measured MSE over that prediction (mean over the
-- sets, which all hold the same number of values): 1 when every value is
-- rounded to its nearest level, 4 when rounding goes down (error in [0, s)).
local function noise_ratio(q)
    local sum = 0
    for _, s in ipairs(q.scales) do sum = sum + s * s end
    return q.mse / (sum / #q.scales / 12)
end
local function near_one(ratio) return ratio > 0.8 and ratio < 1.25 end

-- se5: the sign of the zero-point. Range [-1, 3] at 4 bits: s = 4/15 rounded
-- up to fp16, and z must make 0.0 a level.
local zp = lab.quantize{values = {-1, 0, 3}, bits = 4, range = {-1, 3}}
local exact_s = 4 / 15
local plus = round(-1 / zp.s)   -- round(r_min / s): what the claim says
local minus = round(1 / zp.s)   -- round(-r_min / s): the formula above
lab.say(string.format("The range [-1, 3] at 4 bits: s = %.6f (4/15, its fp16 value). The quantizer chose z = %d; "
    .. "round(-r_min / s) = %d and round(r_min / s) = %d. Watch 0.0: it gets code %d and decodes to %g, so zero "
    .. "stays exact.", zp.s, zp.z, minus, plus, zp.q[2], zp.r_hat[2]))
lab.check{
    id = "se5",
    claim = "the zero-point is z = round(r_min / s)",
    bank_answer = false,
    breaks_with = {"zero-point-plus", "round-floor"},
    measure = function()
        local evidence = string.format("the quantizer's z = %d = round(-r_min/s) = round(%.4f), not round(r_min/s) = %d; "
            .. "range [-1, 3], 4 bits: s = %.6f (4/15 = %.6f rounded up to fp16); 0.0 -> q = %d -> r_hat = %g",
            zp.z, 1 / zp.s, plus, zp.s, exact_s, zp.q[2], zp.r_hat[2])
        local s_ok = zp.s >= exact_s and zp.s <= exact_s * (1 + 2 ^ -10)
        local holds = s_ok and zp.z == minus and zp.q[2] == zp.z and zp.r_hat[2] == 0
        if zp.z == plus then return true, evidence end
        if not holds then
            error(string.format("the quantizer's z = %d is neither round(-r_min/s) = %d nor round(r_min/s) = %d "
                .. "(s = %.6f, 0.0 -> q = %d -> r_hat = %g)", zp.z, minus, plus, zp.s, zp.q[2], zp.r_hat[2]), 0)
        end
        return false, evidence
    end,
}
lab.pause()

-- edge2: a sweep of every multiple of s/16 across the range, asymmetric on
-- [-1, 2.75] (s = 3.75/15 = 0.25, z = 4) and symmetric on [-1.75, 1.75]
-- (s = 1.75/7 = 0.25). s = 0.25 is exact in fp16 and every swept value is
-- exact in float, so each error is exact: 0 on a level, s/2 halfway between.
local s_expected = 0.25
local sweep = {}
for k = 0, 240 do sweep[#sweep + 1] = -1 + k * s_expected / 16 end -- -1 .. 2.75
local sym_sweep = {}
for k = 0, 224 do sym_sweep[#sym_sweep + 1] = -1.75 + k * s_expected / 16 end -- -1.75 .. 1.75
local asym = lab.quantize{values = sweep, bits = 4, range = {-1, 2.75}}
local sym = lab.quantize{values = sym_sweep, bits = 4, symmetric = true, range = {-1.75, 1.75}}
-- Largest error, and whether it is reached exactly at the halfway points and
-- only there (the position within a step: k mod 16 = 8).
local function sweep_errors(values, q)
    local largest, halfway_all, elsewhere_largest = 0, true, 0
    for i, r in ipairs(values) do
        local e = math.abs(r - q.r_hat[i])
        largest = math.max(largest, e)
        if (i - 1) % 16 == 8 then
            halfway_all = halfway_all and e == s_expected / 2
        else
            elsewhere_largest = math.max(elsewhere_largest, e)
        end
    end
    return largest, halfway_all, elsewhere_largest
end
local a_largest, a_halfway, a_elsewhere = sweep_errors(sweep, asym)
local s_largest, s_halfway, s_elsewhere = sweep_errors(sym_sweep, sym)
lab.say(string.format("Next, %d values spaced s/16 apart across [-1, 2.75] (s = 0.25), and %d across [-1.75, 1.75] "
    .. "symmetric. Rounding to nearest puts every value within s/2 = %g of a level. Largest error measured: %g "
    .. "and %g; away from the halfway points at most %g.", #sweep, #sym_sweep, s_expected / 2,
    a_largest, s_largest, math.max(a_elsewhere, s_elsewhere)))
lab.check{
    id = "edge2",
    claim = "a weight exactly halfway between two levels has the largest rounding error, s/2",
    bank_answer = true,
    breaks_with = {"round-floor", "sym-scale-full-range", "zero-point-plus"},
    verdict = a_largest == s_expected / 2 and a_halfway and a_elsewhere < s_expected / 2
        and s_largest == s_expected / 2 and s_halfway and s_elsewhere < s_expected / 2,
    evidence = string.format("asymmetric [-1, 2.75] (s = 0.25, quantizer's s = %g), %d values: largest error %g "
        .. "against s/2 = %g, reached at every halfway point: %s, elsewhere at most %g; symmetric [-1.75, 1.75] (quantizer's "
        .. "s = %g): largest %g, at every halfway point: %s, elsewhere at most %g",
        asym.s, #sweep, a_largest, s_expected / 2, tostring(a_halfway), a_elsewhere, sym.s, s_largest, tostring(s_halfway),
        s_elsewhere),
}

-- edge3, edge4: far outside the same range [-1, 2.75], s = 0.25, z = 4. The
-- top code decodes to s (15 - 4) = 2.75 and code 0 to s (0 - 4) = -1 exactly.
local outside = lab.quantize{values = {1000, -1000}, bits = 4, range = {-1, 2.75}}
lab.say(string.format("Far outside the range: 1000 gets code %d (the top of 0..%d) and decodes to %g; -1000 gets "
    .. "code %d and decodes to %g. Saturating would keep them at the edges, r_max = 2.75 and r_min = -1.", outside.q[1],
    outside.q_max, outside.r_hat[1], outside.q[2], outside.r_hat[2]))
lab.check{
    id = "edge3",
    claim = "a value far above r_max saturates at the top code 2^b - 1 and decodes to r_max",
    bank_answer = true,
    breaks_with = {"wrap-not-clip", "zero-point-plus"},
    verdict = outside.q[1] == 2 ^ 4 - 1 and outside.r_hat[1] == 2.75,
    evidence = string.format("1000 on [-1, 2.75]: q = %d (top code %d), r_hat = s(q - z) = %g x (%d - %d) = %g (r_max 2.75); "
        .. "%d of 2 values clipped", outside.q[1], outside.q_max, outside.s, outside.q[1], outside.z, outside.r_hat[1],
        outside.clipped),
}
lab.check{
    id = "edge4",
    claim = "a value far below r_min saturates at code 0 and decodes to s(0 - z) = r_min",
    bank_answer = true,
    breaks_with = {"wrap-not-clip", "zero-point-plus"},
    verdict = outside.q[2] == 0 and outside.r_hat[2] == -1,
    evidence = string.format("-1000 on [-1, 2.75]: q = %d, r_hat = s(0 - z) = %g x (0 - %d) = %g (r_min -1)",
        outside.q[2], outside.s, outside.z, outside.r_hat[2]),
}
lab.pause()

-- why3: rounding bounds the error of in-range values by s/2; clipping
-- saturates what falls outside instead of wrapping around (4.1 on
-- [-1, 2.75] would need code 20, which kept in 4 bits is 20 mod 16 = 4,
-- decoding to 0); and choosing a clipped range on a tensor with outliers
-- lowers the error of everything else.
local real = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor"}
local clipped = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor", clip = true}
local edge = lab.quantize{values = {4.1}, bits = 4, range = {-1, 2.75}}
local wrapped_code = (round(4.1 / s_expected) + 4) % 16
local wrapped = s_expected * (wrapped_code - 4)
lab.say(string.format("Rounding and clipping together: on a real tensor (%s, 4 bits, one scale) every in-range error "
    .. "is at most s/2: %s (largest %.4f, s/2 = %.4f). 4.1 on [-1, 2.75] decodes to %g, where a code kept by "
    .. "wrapping around would decode to %g. Choosing a clipped range for the tensor: MSE %.3g instead of %.3g.", tensor,
    tostring(real.within_half_step), real.max_error, real.s / 2, edge.r_hat[1], wrapped, clipped.mse, real.mse))
lab.check{
    id = "why3",
    claim = "quantization needs both rounding (error <= s/2 in range) and clipping (saturate outliers)",
    bank_answer = true,
    breaks_with = {"round-floor", "wrap-not-clip", "zero-point-plus"},
    verdict = real.within_half_step and edge.r_hat[1] == 2.75 and clipped.mse < real.mse,
    evidence = string.format("%s 4-bit: every in-range error <= s/2: %s (max %.4f, s/2 = %.4f); 4.1 on [-1, 2.75] "
        .. "decodes to %g (error %.2f; saturating gives 2.75) where the wrapped code %d would give %g (error %.2f); a clipped range: MSE %.3g vs "
        .. "%.3g, %d values clipped",
        tensor, tostring(real.within_half_step), real.max_error, real.s / 2, edge.r_hat[1], math.abs(4.1 - edge.r_hat[1]),
        wrapped_code, wrapped, math.abs(4.1 - wrapped), clipped.mse, real.mse, clipped.clipped),
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
lab.say(string.format("Symmetric against asymmetric, 8 bits. Zero-centred values: MSE %.3g against %.3g. Values that "
    .. "are all positive: %.3g against %.3g, since symmetric leaves its negative codes unused. Stored: %d against %d "
    .. "bytes for %s at 4 bits in groups of 64, because symmetric keeps no zero-points.", c_sym.mse, c_asym.mse,
    l_sym.mse, l_asym.mse, b_sym.packed_bytes, b_asym.packed_bytes, tensor))
lab.check{
    id = "tf5",
    claim = "symmetric quantization is strictly worse than asymmetric",
    bank_answer = false,
    breaks_with = {"sym-scale-full-range", "round-floor", "zero-point-plus"},
    measure = function()
        local centred_ratio, lopsided_ratio = c_sym.mse / c_asym.mse, l_sym.mse / l_asym.mse
        local saved = b_asym.packed_bytes - b_sym.packed_bytes
        local evidence = string.format("%s: on zero-centred values MSE sym %.3g vs asym %.3g ("
            .. "x%.3f; 255 vs 256 levels predict x1.008), and %d fewer bytes packed (4-bit g64 %s: %d vs %d, one zero-point "
            .. "byte for each of the %d groups); worse only on lopsided values (x%.2f; half the levels unused predicts x4); "
            .. "MSE / (s^2/12): sym %.2f, asym %.2f",
            centred_ratio > 1.5 and "worse even on zero-centred values" or "not strictly worse", c_sym.mse, c_asym.mse,
            centred_ratio, saved, tensor, b_sym.packed_bytes, b_asym.packed_bytes, b_asym.sets,
            lopsided_ratio, noise_ratio(c_sym), noise_ratio(c_asym))
        if centred_ratio > 1.5 then return true, evidence end -- worse even where the data is centred
        local holds = centred_ratio > 0.9 and centred_ratio < 1.1 and saved == b_asym.sets
            and lopsided_ratio > 3 and lopsided_ratio < 5 and near_one(noise_ratio(c_sym)) and near_one(noise_ratio(c_asym))
        if not holds then error("the measurement fits neither side: " .. evidence, 0) end
        return false, evidence
    end,
}

-- tf7: INT4 against INT8 on the same tensor (per channel, asymmetric). The
-- error follows the step: s grows 255/15 = 17 times, so the MSE about 289.
local int8 = lab.quantize{model = model, tensor = tensor, bits = 8, granularity = "channel"}
local int4 = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "channel"}
lab.say(string.format("INT8 against INT4 on %s, one scale per row: the mean step grows x%.1f (255 / 15 levels), and "
    .. "the MSE x%.0f; the step's square is x%.0f, and the claim below says x2.", tensor,
    int4.scale_mean / int8.scale_mean, int4.mse / int8.mse, (int4.scale_mean / int8.scale_mean) ^ 2))
lab.check{
    id = "tf7",
    claim = "INT4 has exactly twice the error of INT8",
    bank_answer = false,
    breaks_with = {"round-floor", "zero-point-plus"},
    measure = function()
        local mse_ratio = int4.mse / int8.mse
        local step_ratio = int4.scale_mean / int8.scale_mean
        local evidence = string.format("x%.0f the MSE, not x2: %s per channel, mean s %.4g (INT8, %d levels) vs %.4g "
            .. "(INT4, %d levels), x%.1f, so (s ratio)^2 = x%.0f; MSE / (s^2/12): INT8 %.2f, INT4 %.2f; max error x%.1f",
            mse_ratio, tensor, int8.scale_mean, int8.levels, int4.scale_mean, int4.levels, step_ratio, step_ratio ^ 2,
            noise_ratio(int8), noise_ratio(int4), int4.max_error / int8.max_error)
        if mse_ratio >= 1.5 and mse_ratio <= 2.5 then return true, evidence end
        local follows_step = mse_ratio / step_ratio ^ 2 > 0.7 and mse_ratio / step_ratio ^ 2 < 1.4
        if not (follows_step and near_one(noise_ratio(int8)) and near_one(noise_ratio(int4))) then
            error("the error does not follow the step size: " .. evidence, 0)
        end
        return false, evidence
    end,
}
lab.pause()

-- se6: how many (s, z) pairs, and the error they give: per tensor, per
-- channel (row), per group of 64 inputs. Finer sets fit their values more
-- closely, so the MSE falls at each step.
local per_tensor = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "tensor"}
local per_channel = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "channel"}
local per_group = lab.quantize{model = model, tensor = tensor, bits = 4, granularity = "group", group_size = 64}
lab.say(string.format("How many scales: per tensor %d (MSE %.3g), per channel %d (MSE %.3g), per group of 64 inputs "
    .. "%d (MSE %.3g). A finer set of scales fits its own values more closely, so the error should fall at each step.",
    per_tensor.sets, per_tensor.mse, per_channel.sets, per_channel.mse, per_group.sets, per_group.mse))
lab.check{
    id = "se6",
    claim = "per-tensor quantization is finer-grained than per-channel",
    bank_answer = false,
    breaks_with = {"group-tensor-max", "round-floor", "zero-point-plus"},
    measure = function()
        local evidence = string.format("coarser: %s 4-bit, per tensor %d scale, MSE %.3g; per channel %d scales, MSE %.3g "
            .. "(x%.1f lower); per group of 64 %d scales, MSE %.3g (x%.1f lower again); MSE / (s^2/12): channel %.2f, group %.2f",
            tensor, per_tensor.sets, per_tensor.mse, per_channel.sets, per_channel.mse, per_tensor.mse / per_channel.mse,
            per_group.sets, per_group.mse, per_channel.mse / per_group.mse, noise_ratio(per_channel), noise_ratio(per_group))
        if per_tensor.mse < per_channel.mse then return true, evidence end
        local ladder = per_tensor.sets == 1 and per_channel.sets == per_tensor.rows
            and per_group.sets == per_tensor.rows * per_tensor.cols // 64
            and per_tensor.mse > 1.5 * per_channel.mse and per_channel.mse > 1.5 * per_group.mse
        if not (ladder and near_one(noise_ratio(per_channel)) and near_one(noise_ratio(per_group))) then
            error("finer sets did not each lower the error as rounding predicts: " .. evidence, 0)
        end
        return false, evidence
    end,
}
