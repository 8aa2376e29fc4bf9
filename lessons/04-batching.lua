-- 04 Batching: continuous batching and PagedAttention are two mechanisms;
-- a bigger batch helps until the step turns compute-bound; paging raises
-- throughput by fitting more requests, not by speeding one up.
--
-- Times here are CPU times of the process with one engine thread (os.clock
-- and lab.time's cpu_seconds): other programs on a shared machine stretch
-- wall time, not the CPU time this process spends.
lab.lesson{
    title = "Batching: scheduling vs memory, batch size, throughput vs latency",
    claims = {"tf4", "tf9", "why5", "edge5"},
}

local tiny = lab.model("tiny")
local small = lab.model("small")

-- Requests of mixed lengths, the same in every engine.
local function add_requests(e, count, prompt_base, output_base)
    for i = 1, count do
        local prompt = {1}
        for k = 1, prompt_base + (i * 5) % 9 do prompt[#prompt + 1] = 3 + (i * 37 + k * 11) % 250 end
        e:add{ids = prompt, max_tokens = output_base + (i * 11) % (2 * output_base)}
    end
end

-- tf4: the 2 x 2 grid. At most 4 sequences run at once; the pool is large
-- enough that memory never limits the contiguous engine's admissions.
local grid = {}
for _, kv in ipairs{"paged", "contiguous"} do
    for _, batching in ipairs{"continuous", "static"} do
        local e = lab.engine{model = tiny, kv = kv, batching = batching, max_seqs = 4, block_size = 16, num_blocks = 256}
        add_requests(e, 12, 8, 6)
        e:run()
        grid[kv .. "/" .. batching] = e:totals()
        e:close()
    end
end
local function g(key) return grid[key] end
local layout_sets_waste = g("contiguous/continuous").waste_pct > 2 * g("paged/continuous").waste_pct
    and g("contiguous/static").waste_pct > 2 * g("paged/static").waste_pct
local batching_sets_steps = g("paged/static").steps > g("paged/continuous").steps
    and g("contiguous/static").steps > g("contiguous/continuous").steps
local steps_ignore_layout = g("paged/continuous").steps == g("contiguous/continuous").steps
    and g("paged/static").steps == g("contiguous/static").steps
lab.check{
    id = "tf4",
    claim = "continuous batching and PagedAttention are one mechanism",
    bank_answer = false,
    verdict = not (layout_sets_waste and batching_sets_steps and steps_ignore_layout),
    evidence = string.format("12 requests, 4 at a time: waste %% paged/contiguous: continuous %.1f/%.1f, static %.1f/%.1f; "
        .. "steps continuous/static: paged %d/%d, contiguous %d/%d (the layout sets the waste, the batching the steps)",
        g("paged/continuous").waste_pct, g("contiguous/continuous").waste_pct, g("paged/static").waste_pct,
        g("contiguous/static").waste_pct, g("paged/continuous").steps, g("paged/static").steps,
        g("contiguous/continuous").steps, g("contiguous/static").steps),
}
lab.pause()

-- tf9: decode throughput against the batch size, with a pool that always
-- has room (lab.time sizes it). Each step's arithmetic intensity (FLOPs per
-- byte, from the kernels) says when the step stops being memory-bound. A
-- memory-bound step does 4x the work in about the same time when the batch
-- grows 4x; we count a 4x step as "raising tokens/s" when it gains >= 1.25x.
local machine = lab.machine()
local batches, rates, intensities = {1, 4, 16, 64, 256}, {}, {}
for i, batch in ipairs(batches) do
    local t = lab.time{model = small, phase = "decode", tokens = 2, batch = batch, context = 1, repeats = 3, threads = 1}
    rates[i] = t.cpu_tokens_per_s
    intensities[i] = t.intensity
end
local always_rises = true
for i = 2, #batches do always_rises = always_rises and rates[i] >= rates[i - 1] * 1.25 end
local parts = {}
for i, batch in ipairs(batches) do
    local gain = i > 1 and string.format(" x%.2f", rates[i] / rates[i - 1]) or ""
    parts[#parts + 1] = string.format("B=%d %.0f tok/s%s (%.1f FLOP/B)", batch, rates[i], gain, intensities[i])
end
lab.check{
    id = "tf9",
    claim = "with spare memory a bigger batch always raises tokens/s",
    bank_answer = false,
    verdict = always_rises,
    evidence = table.concat(parts, ", ") .. string.format("; ridge of this machine %.1f FLOP/B: past it the step is compute-bound",
        machine.ridge),
}
lab.pause()

-- why5 and edge5: the same budget of 512 slots (32 blocks of 16).
-- Contiguous reserves the model's whole length (512) per request, so one
-- runs at a time; paged holds each request's blocks only (at most 4 blocks
-- for these lengths), so about 8 fit. On a CPU whose cache holds the small
-- model, a batch of 4 is already close to compute-bound (see tf9), so the
-- scenario compares batch 1 against the batch paging makes room for.
local POOL_BLOCKS = 32
local function serve(kv, count)
    local e = lab.engine{model = small, kv = kv, block_size = 16, num_blocks = POOL_BLOCKS, threads = 1}
    add_requests(e, count, 12, 12)
    local start = os.clock()
    e:run()
    local cpu = os.clock() - start
    local t = e:totals()
    e:close()
    return {rate = t.generated_tokens / cpu, peak = t.peak_running, steps = t.steps, cpu = cpu}
end
local paged_many, contiguous_many = serve("paged", 16), serve("contiguous", 16)

-- One request alone: its CPU time per decode step, paged and contiguous.
-- The two engines step in turn, one step each, so that whatever else the
-- machine does slows both alike; the medians of 64 steps are compared.
local lone = {}
for _, kv in ipairs{"paged", "contiguous"} do
    lone[kv] = lab.engine{model = small, kv = kv, block_size = 16, num_blocks = POOL_BLOCKS, threads = 1}
    lone[kv]:add{prompt = "Hi", max_tokens = 65}
    lone[kv]:step() -- the prompt
end
local per_step = {paged = {}, contiguous = {}}
local work = {}
for i = 1, 64 do
    for _, kv in ipairs{"paged", "contiguous"} do
        local start = os.clock()
        local r = lone[kv]:step()
        per_step[kv][i] = os.clock() - start
        work[kv] = r.flops.total
    end
end
local tpot_paged, tpot_contiguous = lab.median(per_step.paged), lab.median(per_step.contiguous)
local throughput_gain = paged_many.rate / contiguous_many.rate
local latency_ratio = tpot_paged / tpot_contiguous
lab.check{
    id = "why5",
    claim = "PagedAttention raises throughput by fitting more requests, but leaves one request's latency unchanged",
    bank_answer = true,
    verdict = throughput_gain > 1.3 and paged_many.peak > contiguous_many.peak and latency_ratio > 0.8 and latency_ratio < 1.25,
    evidence = string.format("16 requests, %d slots: paged runs %d at once, %.0f tok/s; contiguous %d at once, %.0f tok/s "
        .. "(x%.2f); one request alone: %.2f ms vs %.2f ms CPU per token (x%.2f, median of 64 interleaved steps; %d vs %d "
        .. "FLOPs per step)",
        POOL_BLOCKS * 16, paged_many.peak, paged_many.rate, contiguous_many.peak, contiguous_many.rate, throughput_gain,
        tpot_paged * 1e3,
        tpot_contiguous * 1e3, latency_ratio, work.paged, work.contiguous),
}
lab.check{
    id = "edge5",
    claim = "with batch 1 and a short prompt PagedAttention gains little",
    bank_answer = true,
    verdict = 1 / latency_ratio < 1.25,
    evidence = string.format("one request with a 3-token prompt: paged %.0f tok/s, contiguous %.0f tok/s (x%.2f), against x%.2f "
        .. "for 16 requests", 1 / tpot_paged, 1 / tpot_contiguous, 1 / latency_ratio, throughput_gain),
}
