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
-- holds. A claim the bank calls false is refuted only when the quantizer
-- shows the formula that contradicts it; when the measurement fits neither
-- the claim nor the formula, the verdict is that the claim was not refuted
-- (DISAGREE with the bank, as under a fault), and the evidence says which
-- number missed which formula.
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
    -- The claim is refuted only by the formula that contradicts it: z =
    -- round(-r_min/s) = 4, with 0.0 stored as code z and decoded to exactly 0,
    -- and s = 4/15 rounded up to fp16 (at most 2^-10 of s above it). A z that
    -- is neither 4 nor round(r_min/s) = -4 (round-floor gives 3,
    -- zero-point-plus 0) leaves the claim unrefuted, and the line says which
    -- number missed which formula.
    measure = function()
        local s_ok = zp.s >= exact_s and zp.s <= exact_s * (1 + 2 ^ -10)
        local refuted = s_ok and zp.z == minus and zp.q[2] == zp.z and zp.r_hat[2] == 0
        local finding
        if refuted then
            finding = string.format("the quantizer's z = %d = round(-r_min/s) = round(%.4f), not round(r_min/s) = %d",
                zp.z, 1 / zp.s, plus)
        elseif zp.z == plus then
            finding = string.format("the quantizer's z = %d = round(r_min/s), as the claim says (round(-r_min/s) = %d)",
                zp.z, minus)
        else
            local missed = {}
            if zp.z ~= minus then
                missed[#missed + 1] = string.format("z = %d is neither round(-r_min/s) = %d nor the claim's "
                    .. "round(r_min/s) = %d", zp.z, minus, plus)
            end
            if not s_ok then
                missed[#missed + 1] = string.format("s = %.6f is not 4/15 = %.6f rounded up to fp16", zp.s, exact_s)
            end
            if zp.q[2] ~= zp.z or zp.r_hat[2] ~= 0 then
                missed[#missed + 1] = string.format("0.0 is not stored as z = %d decoding to 0", zp.z)
            end
            finding = "not refuted: " .. table.concat(missed, "; ")
        end
        return not refuted, string.format("%s; range [-1, 3], 4 bits: s = %.6f (4/15 = %.6f rounded up to fp16); "
            .. "0.0 -> q = %d -> r_hat = %g", finding, zp.s, exact_s, zp.q[2], zp.r_hat[2])
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
    -- What refutes "strictly worse" is a case where symmetric is no worse:
    -- on zero-centred values its MSE is within x0.9 to x1.1 of asymmetric's
    -- (255 vs 256 levels predict x1.008), both at s^2/12 of their steps (0.8 to
    -- 1.25), it stores one zero-point byte less per group, and on lopsided
    -- values it is x3 to x5 worse as its unused half predicts (x4). A centred
    -- MSE more than x1.5 worse says the claim holds; a quantizer that misses
    -- the prediction otherwise (round-floor gives 4 s^2/12, zero-point-plus
    -- an asymmetric MSE thousands of times s^2/12) refutes nothing, and the
    -- line names the number that missed.
    measure = function()
        local centred_ratio, lopsided_ratio = c_sym.mse / c_asym.mse, l_sym.mse / l_asym.mse
        local saved = b_asym.packed_bytes - b_sym.packed_bytes
        local sym_noise, asym_noise = noise_ratio(c_sym), noise_ratio(c_asym)
        local claim_holds = centred_ratio > 1.5 -- worse even where the data is centred
        local refuted = not claim_holds and centred_ratio > 0.9 and centred_ratio < 1.1 and saved == b_asym.sets
            and lopsided_ratio > 3 and lopsided_ratio < 5 and near_one(sym_noise) and near_one(asym_noise)
        local finding
        if claim_holds then
            finding = "worse even on zero-centred values"
        elseif refuted then
            finding = "not strictly worse"
        else
            local missed = {}
            if not (centred_ratio > 0.9 and centred_ratio < 1.1) then
                missed[#missed + 1] = string.format("centred MSE ratio x%.3f, not within x0.9 to x1.1", centred_ratio)
            end
            if saved ~= b_asym.sets then
                missed[#missed + 1] = string.format("%d bytes saved, not one per group (%d)", saved, b_asym.sets)
            end
            if not (lopsided_ratio > 3 and lopsided_ratio < 5) then
                missed[#missed + 1] = string.format("lopsided ratio x%.2f, not x3 to x5", lopsided_ratio)
            end
            if not (near_one(sym_noise) and near_one(asym_noise)) then
                missed[#missed + 1] = string.format("MSE / (s^2/12) %.2f and %.2f where rounding to nearest gives 1 "
                    .. "(0.8 to 1.25)", sym_noise, asym_noise)
            end
            finding = "not refuted, the measurement fits neither side (" .. table.concat(missed, "; ") .. ")"
        end
        return not refuted, string.format("%s: on zero-centred values MSE sym %.3g vs asym %.3g ("
            .. "x%.3f; 255 vs 256 levels predict x1.008), and %d fewer bytes packed (4-bit g64 %s: %d vs %d, one zero-point "
            .. "byte for each of the %d groups); worse only on lopsided values (x%.2f; half the levels unused predicts x4); "
            .. "MSE / (s^2/12): sym %.2f, asym %.2f",
            finding, c_sym.mse, c_asym.mse, centred_ratio, saved, tensor, b_sym.packed_bytes, b_asym.packed_bytes,
            b_asym.sets, lopsided_ratio, sym_noise, asym_noise)
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
    -- What refutes x2 is the rounding model: each format's MSE is s^2/12 of
    -- its own step (ratio 0.8 to 1.25), so the MSE grows as the step's square
    -- (x289 expected, 0.7 to 1.4 of it allowed). An MSE ratio near 2 (1.5 to
    -- 2.5) says the claim holds; a quantizer whose error does not follow s^2/12
    -- (round-floor gives 4 s^2/12, zero-point-plus thousands) refutes nothing,
    -- and the line names the ratio that missed.
    measure = function()
        local mse_ratio = int4.mse / int8.mse
        local step_ratio = int4.scale_mean / int8.scale_mean
        local int8_noise, int4_noise = noise_ratio(int8), noise_ratio(int4)
        local follows_step = mse_ratio / step_ratio ^ 2 > 0.7 and mse_ratio / step_ratio ^ 2 < 1.4
        local claim_holds = mse_ratio >= 1.5 and mse_ratio <= 2.5
        local refuted = not claim_holds and follows_step and near_one(int8_noise) and near_one(int4_noise)
        local finding
        if claim_holds then
            finding = string.format("x%.2f the MSE, about x2 as the claim says", mse_ratio)
        elseif refuted then
            finding = string.format("x%.0f the MSE, not x2", mse_ratio)
        else
            finding = string.format("not refuted: x%.0f the MSE, where rounding to nearest predicts (s ratio)^2 = x%.0f "
                .. "(0.7 to 1.4 of it) and each MSE / (s^2/12) = 1 (0.8 to 1.25)", mse_ratio, step_ratio ^ 2)
        end
        return not refuted, string.format("%s: %s per channel, mean s %.4g (INT8, %d levels) vs %.4g (INT4, %d levels), "
            .. "x%.1f, so (s ratio)^2 = x%.0f; MSE / (s^2/12): INT8 %.2f, INT4 %.2f; max error x%.1f",
            finding, tensor, int8.scale_mean, int8.levels, int4.scale_mean, int4.levels, step_ratio, step_ratio ^ 2,
            int8_noise, int4_noise, int4.max_error / int8.max_error)
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
    -- What refutes the claim is the ladder the scale counts predict: 1, then
    -- one per row (384), then one per 64 inputs (2304) sets, each finer step
    -- lowering the MSE more than x1.5, and the finer two at s^2/12 of their own
    -- steps (ratio 0.8 to 1.25). A per-tensor MSE below the per-channel one says
    -- the claim holds; a ladder that breaks (group-tensor-max gives groups the
    -- tensor's range, round-floor 4 s^2/12) refutes nothing, and the line names
    -- the rung that broke.
    measure = function()
        local expected_groups = per_tensor.rows * per_tensor.cols // 64
        local counts_ok = per_tensor.sets == 1 and per_channel.sets == per_tensor.rows
            and per_group.sets == expected_groups
        local channel_lower = per_tensor.mse > 1.5 * per_channel.mse
        local group_lower = per_channel.mse > 1.5 * per_group.mse
        local channel_noise, group_noise = noise_ratio(per_channel), noise_ratio(per_group)
        local claim_holds = per_tensor.mse < per_channel.mse
        local refuted = not claim_holds and counts_ok and channel_lower and group_lower and near_one(channel_noise)
            and near_one(group_noise)
        local finding
        if claim_holds then
            finding = "finer: per tensor has the lower MSE, as the claim says"
        elseif refuted then
            finding = "coarser"
        else
            local missed = {}
            if not counts_ok then
                missed[#missed + 1] = string.format("sets %d / %d / %d where 1 / %d / %d are expected", per_tensor.sets,
                    per_channel.sets, per_group.sets, per_tensor.rows, expected_groups)
            end
            if not channel_lower then
                missed[#missed + 1] = string.format("per channel only x%.2f below per tensor, not more than x1.5",
                    per_tensor.mse / per_channel.mse)
            end
            if not group_lower then
                missed[#missed + 1] = string.format("per group only x%.2f below per channel, not more than x1.5",
                    per_channel.mse / per_group.mse)
            end
            if not (near_one(channel_noise) and near_one(group_noise)) then
                missed[#missed + 1] = string.format("MSE / (s^2/12) %.2f and %.2f where rounding to nearest gives 1 "
                    .. "(0.8 to 1.25)", channel_noise, group_noise)
            end
            finding = "not refuted, finer sets did not each lower the error as rounding predicts (" .. table.concat(missed, "; ")
                .. ")"
        end
        return not refuted, string.format("%s: %s 4-bit, per tensor %d scale, MSE %.3g; per channel %d scales, MSE %.3g "
            .. "(x%.1f lower); per group of 64 %d scales, MSE %.3g (x%.1f lower again); MSE / (s^2/12): channel %.2f, group %.2f",
            finding, tensor, per_tensor.sets, per_tensor.mse, per_channel.sets, per_channel.mse,
            per_tensor.mse / per_channel.mse, per_group.sets, per_group.mse, per_channel.mse / per_group.mse, channel_noise,
            group_noise)
    end,
}
