-- The question bank (quiz/README.md describes the format).
--
-- One entry per item of shared/seed/question-bank.txt, in that order, each
-- written afresh in English (and in Hinglish under hi_en). `seed` names the
-- seed section, the item's position in it and a few words of the seed
-- question, so that tests/lab/quiz/test_quiz_bank.c can check that every seed
-- item is here exactly once. `claim` is the id of the lesson check
-- (lessons/*.lua, lab.check{id = ...}) that measures the claim live.
--
-- kind:    true_false   answer = true | false, then the student grades their own justification
--          spot_error   choices = {...}, answer = index of the right choice (1-based)
--          why          answer = the model answer (text), self-graded
--          edge         choices + answer index, or a text answer
--          recall       answer = the model answer (text), self-graded
-- topics:  kv-sizing, paged, batching, roofline, quantization, awq-gptq, parallelism
-- Choices are shuffled when asked, so the right one is written first here.
return {
    -- ---- True or false -----------------------------------------------------------------
    {
        id = "tf1", kind = "true_false", topics = {"paged"}, claim = "tf1",
        seed = {section = "true_false", index = 1, match = "kam FLOPs"},
        prompt = "PagedAttention makes the attention computation itself use fewer FLOPs.",
        answer = false,
        explanation = "The dot products and the softmax are exactly the same. PagedAttention only changes where "
            .. "the KV cache lives (fixed-size blocks found through a block table), so less memory is wasted "
            .. "and a bigger batch fits. Throughput rises because of the bigger batch, not because the math got cheaper.",
        hi_en = {
            prompt = "PagedAttention ki wajah se attention ka calculation khud kam FLOPs leta hai.",
            explanation = "Dot products aur softmax bilkul same rehte hain. PagedAttention sirf yeh badalta hai ki KV "
                .. "cache memory mein kahan rakha hai (fixed blocks, block table se milte hain). Kam waste matlab "
                .. "bada batch fit hota hai; throughput batch se badhta hai, math sasta nahi hota.",
        },
    },
    {
        id = "tf2", kind = "true_false", topics = {"quantization", "roofline"}, claim = "tf2",
        seed = {section = "true_false", index = 2, match = "INT4 (W4A16)"},
        prompt = "Weight-only INT4 quantization (W4A16) always makes the prefill phase faster.",
        answer = false,
        explanation = "Prefill runs big matmuls over the whole prompt and is limited by compute, not by reading "
            .. "weights. W4A16 has to turn each INT4 weight back into FP16 before multiplying, which is extra work "
            .. "exactly where compute is the limit, so prefill can even slow down. The gain is in decode, which is "
            .. "limited by memory bandwidth.",
        hi_en = {
            prompt = "Weight-only INT4 (W4A16) prefill ko hamesha fast karta hai.",
            explanation = "Prefill bade matmuls chalata hai aur compute se limited hai, weight padhne se nahi. W4A16 "
                .. "ko har INT4 weight multiply se pehle FP16 mein wapas banana padta hai; yeh extra kaam wahin "
                .. "lagta hai jahan compute hi bottleneck hai, to prefill slow bhi ho sakta hai. Fayda decode mein hai.",
        },
    },
    {
        id = "tf3", kind = "true_false", topics = {"kv-sizing"}, claim = "tf3",
        seed = {section = "true_false", index = 3, match = "quadratically"},
        prompt = "The KV cache grows quadratically with the sequence length.",
        answer = false,
        explanation = "One key and one value per token per layer: 2 * B * S * L * kv_dim * p bytes, so doubling S "
            .. "doubles it. kv_dim is d_model with multi-head attention and n_kv_heads * d_head with grouped-query "
            .. "attention (Llama-2-70B: 8 * 128 = 1024, not 8192). The t^2 is work, not memory: step t attends over "
            .. "all t cached keys, and without the cache every step would also recompute the past keys and values.",
        hi_en = {
            prompt = "KV cache sequence length ke saath quadratic (square) badhta hai.",
            explanation = "Har token har layer mein ek key aur ek value: 2 * B * S * L * kv_dim * p bytes, to S dugna "
                .. "to cache dugna. kv_dim multi-head attention mein d_model hai, grouped-query attention mein "
                .. "n_kv_heads * d_head (Llama-2-70B: 8 * 128 = 1024, 8192 nahi). t^2 kaam hai, memory nahi: step t "
                .. "saari t cached keys par attention karta hai, aur cache ke bina har step purani keys/values bhi "
                .. "dobara banata.",
        },
    },
    {
        id = "tf4", kind = "true_false", topics = {"batching", "paged"}, claim = "tf4",
        seed = {section = "true_false", index = 4, match = "Continuous batching aur PagedAttention"},
        prompt = "Continuous batching and PagedAttention are one and the same mechanism.",
        answer = false,
        explanation = "PagedAttention manages how KV memory is allocated (blocks and block tables). Continuous "
            .. "batching manages scheduling: finished requests leave and waiting ones join at every step. Servers "
            .. "ship them together, but each one works without the other.",
        hi_en = {
            prompt = "Continuous batching aur PagedAttention ek hi cheez hain.",
            explanation = "PagedAttention KV memory ka allocation sambhalta hai (blocks, block tables). Continuous "
                .. "batching scheduling sambhalta hai: har step par khatam requests nikalti hain, nayi judti hain. "
                .. "Dono saath aate hain par ek doosre ke bina bhi chalte hain.",
        },
    },
    {
        id = "tf5", kind = "true_false", topics = {"quantization"}, claim = "tf5",
        seed = {section = "true_false", index = 5, match = "Symmetric quantization"},
        prompt = "Symmetric quantization (z = 0) is strictly worse than asymmetric quantization, because its "
            .. "zero-point is fixed.",
        answer = false,
        explanation = "For weights that are roughly centred on zero, symmetric wastes almost none of the range, and "
            .. "it is simpler and faster (no zero-point to store or subtract). Asymmetric helps when the range is "
            .. "lopsided, for example ReLU outputs that are never negative.",
        hi_en = {
            prompt = "Symmetric quantization (z = 0) asymmetric se hamesha bura hai kyunki zero-point fixed hai.",
            explanation = "Zero ke aas-paas centred weights ke liye symmetric range lagbhag waste nahi karta, aur "
                .. "simple aur fast hai (zero-point na store karna, na ghatana). Asymmetric tab kaam aata hai jab "
                .. "range ek taraf jhuki ho, jaise ReLU outputs jo kabhi negative nahi hote.",
        },
    },
    {
        id = "tf6", kind = "true_false", topics = {"paged"}, claim = "tf6",
        seed = {section = "true_false", index = 6, match = "bookkeeping minimize"},
        prompt = "The largest possible block_size is best, because it keeps the bookkeeping smallest.",
        answer = false,
        explanation = "Large blocks bring internal fragmentation back: the last block of every request can leave "
            .. "up to block_size - 1 slots empty. Smaller block tables do not pay for that waste; the usual sweet "
            .. "spot is around 16 to 32 tokens per block.",
        hi_en = {
            prompt = "block_size jitna bada ho utna achha, kyunki bookkeeping sabse kam hoti hai.",
            explanation = "Bade blocks internal fragmentation wapas le aate hain: har request ka aakhri block "
                .. "block_size - 1 slots tak khaali chhod sakta hai. Chhoti block table is waste ki bharpai nahi "
                .. "karti; aam taur par 16-32 tokens ka block theek rehta hai.",
        },
    },
    {
        id = "tf7", kind = "true_false", topics = {"quantization"}, claim = "tf7",
        seed = {section = "true_false", index = 7, match = "do guna accuracy loss"},
        prompt = "INT4 loses exactly twice as much accuracy as INT8.",
        answer = false,
        explanation = "The error follows the step s, which is proportional to 1 / (2^b - 1). INT8 splits the range "
            .. "into 255 gaps and INT4 into only 15, so the INT4 step is 255 / 15 = 17 times larger, and the mean "
            .. "squared error (s^2 / 12 for rounding) about 17^2 = 289 times: far worse than 2x.",
        hi_en = {
            prompt = "INT4 ka accuracy loss INT8 se theek do guna hota hai.",
            explanation = "Error step s ke saath chalta hai, aur s ~ 1 / (2^b - 1). INT8 range ko 255 gaps mein "
                .. "baant ta hai, INT4 sirf 15 mein, to INT4 ka step 255 / 15 = 17 guna bada hai, aur mean squared "
                .. "error (rounding ka s^2 / 12) lagbhag 17^2 = 289 guna: 2x se kahin zyada.",
        },
    },
    {
        id = "tf8", kind = "true_false", topics = {"quantization"}, claim = "tf8",
        seed = {section = "true_false", index = 8, match = "FP16 copy store"},
        prompt = "After quantizing the weights, inference does not need to keep an FP16 copy of them.",
        answer = true,
        explanation = "True for the stored weights: only the packed integers and small per-group scales are kept. "
            .. "FP16 values are rebuilt on the fly inside each matmul and are never stored.",
        hi_en = {
            prompt = "Weights quantize karne ke baad inference ko unki FP16 copy rakhne ki zaroorat nahi.",
            explanation = "Sahi (stored weights ke liye): sirf packed integers aur chhote per-group scales rehte "
                .. "hain. FP16 values har matmul ke andar turant ban jaati hain, kabhi save nahi hoti.",
        },
    },
    {
        id = "tf9", kind = "true_false", topics = {"batching", "roofline"}, claim = "tf9",
        seed = {section = "true_false", index = 9, match = "spare HBM"},
        prompt = "If the GPU has spare HBM, a bigger batch always raises tokens per second.",
        answer = false,
        explanation = "False; HBM is to blame only at long context. Per step, Llama-2-7B reads W = 13.2 GB of "
            .. "weights once per batch and S x 512 KiB of KV per sequence. If 295 x S x 512 KiB < W (S below 85 "
            .. "tokens), gains stop at the compute ridge: H100 989 TFLOP/s / 3.35 TB/s = 295 FLOP/byte, B ~ 295. "
            .. "Longer: KV passes W at B = W / (S x 512 KiB) = 6 (S = 4096); steps stay memory-bound (218 to 1294 "
            .. "tok/s, B = 1 to 30) near 3.35 TB/s / 2 GiB = 1560 tok/s: the bank is right there.",
        hi_en = {
            prompt = "GPU mein HBM bacha ho to bada batch hamesha tokens/sec badhata hai.",
            explanation = "False; HBM sirf lambe context par zimmedar hai. Har step Llama-2-7B W = 13.2 GB weights "
                .. "batch ke liye ek baar padhta hai, aur har sequence ka S x 512 KiB KV. Agar 295 x S x 512 KiB < W "
                .. "(S 85 tokens se kam), fayda compute ridge par rukta hai: H100 989 TFLOP/s / 3.35 TB/s = 295 "
                .. "FLOP/byte, B ~ 295. Lamba context: KV W se aage B = W / (S x 512 KiB) = 6 par (S = 4096); step "
                .. "memory-bound (B = 1 se 30: 218 se 1294 tok/s), seema 3.35 TB/s / 2 GiB = 1560 tok/s: wahan bank "
                .. "sahi hai.",
        },
    },
    {
        id = "tf10", kind = "true_false", topics = {"paged"}, claim = "tf10",
        seed = {section = "true_false", index = 10, match = "system prompt share"},
        prompt = "Two requests that share one system prompt must each store their own copy of that prompt's KV.",
        answer = false,
        explanation = "With paged KV they point at the same prefix blocks (reference-counted). A private copy is "
            .. "made by copy-on-write only when one of them writes into a shared block, that is, when their "
            .. "generations diverge.",
        hi_en = {
            prompt = "Ek hi system prompt wali do requests ko us prompt ka KV alag-alag store karna hi padega.",
            explanation = "Paged KV mein dono same prefix blocks ko point karti hain (reference count ke saath). "
                .. "Apni copy copy-on-write se tabhi banti hai jab koi shared block mein likhe, yaani jab "
                .. "generations alag hone lagein.",
        },
    },

    -- ---- Spot the error -----------------------------------------------------------------
    {
        id = "se1", kind = "spot_error", topics = {"kv-sizing"}, claim = "se1",
        seed = {section = "spot_error", index = 1, match = "KV cache size ="},
        prompt = "Spot the error: \"KV cache size = B * S * L * d_model * p\"",
        choices = {
            "The factor 2 is missing: each token stores both a key and a value",
            "S should be squared, since every token attends to all earlier ones",
            "L does not belong: all the layers share one cache of keys and values",
            "p is wrong: KV entries stay in FP32 whatever format the weights use",
        },
        answer = 1,
        explanation = "Each token keeps a key and a value in every layer: 2 * B * S * L * d_model * p with "
            .. "multi-head attention (Llama-2-7B: 2 * 32 * 4096 * 2 = 512 KiB per token). With grouped-query "
            .. "attention only n_kv_heads heads are stored, so d_model becomes n_kv_heads * d_head: Llama-2-70B "
            .. "2 * 80 * 8 * 128 * 2 = 320 KiB per token, not the 2560 KiB d_model would give.",
        hi_en = {
            prompt = "Galti pakdo: \"KV cache size = B * S * L * d_model * p\"",
            explanation = "Har token har layer mein ek key aur ek value rakhta hai: multi-head attention mein "
                .. "2 * B * S * L * d_model * p (Llama-2-7B: 2 * 32 * 4096 * 2 = 512 KiB per token). Grouped-query "
                .. "attention mein sirf n_kv_heads heads store hote hain, to d_model ki jagah n_kv_heads * d_head: "
                .. "Llama-2-70B 2 * 80 * 8 * 128 * 2 = 320 KiB per token, d_model wale 2560 KiB nahi.",
        },
    },
    {
        id = "se2", kind = "spot_error", topics = {"kv-sizing"}, claim = "se2",
        seed = {section = "spot_error", index = 2, match = "per head kaam karta"},
        prompt = "Spot the error: \"We use d_head in the KV formula, because attention works per head.\"",
        choices = {
            "One head only: the cache holds all KV heads, n_kv_heads * d_head wide",
            "Nothing: each head keeps its own cache, and d_head is its width",
            "It should be d_model squared, the size of the K and V weight matrices",
            "It should be the feed-forward width that K and V are projected to",
        },
        answer = 1,
        explanation = "The cache stores all heads, and n_heads * d_head = d_model, so the whole-cache formula uses "
            .. "d_model. With grouped-query attention only the KV heads are stored: the width is "
            .. "n_kv_heads * d_head (Llama-2-70B: 8 * 128 = 1024 instead of 8192).",
        hi_en = {
            prompt = "Galti pakdo: \"KV formula mein d_head lete hain kyunki attention har head par alag chalta hai.\"",
            explanation = "Cache saare heads rakhta hai, aur n_heads * d_head = d_model, isliye poore cache ke "
                .. "formula mein d_model aata hai. GQA mein sirf KV heads store hote hain: width "
                .. "n_kv_heads * d_head (Llama-2-70B: 8 * 128 = 1024, 8192 nahi).",
        },
    },
    {
        id = "se3", kind = "spot_error", topics = {"awq-gptq", "quantization"}, claim = "se3",
        seed = {section = "spot_error", index = 3, match = "AWQ layer ke output error"},
        prompt = "Spot the error: \"AWQ works by minimising the layer's output error with a Hessian.\"",
        choices = {
            "It is GPTQ; AWQ scales channels picked by activation size, no Hessian",
            "AWQ follows the loss gradient, as quantization-aware training does",
            "Nothing: AWQ rounds the weights using the inverse Hessian of X^T X",
            "AWQ quantizes only the activations and keeps all the weights in FP16",
        },
        answer = 1,
        explanation = "The Hessian (built from the calibration inputs, X^T X) and the error feedback that uses it "
            .. "are GPTQ. AWQ finds the weight channels that meet large activations and scales them before "
            .. "rounding so that they lose less; it needs no Hessian.",
        hi_en = {
            prompt = "Galti pakdo: \"AWQ Hessian ki madad se layer ka output error minimise karta hai.\"",
            explanation = "Hessian (calibration inputs se, X^T X) aur uska error feedback GPTQ hai. AWQ bade "
                .. "activations wale weight channels ko rounding se pehle scale karta hai taaki woh kam bigdein; "
                .. "Hessian nahi chahiye.",
        },
    },
    {
        id = "se4", kind = "spot_error", topics = {"quantization"}, claim = "se4",
        seed = {section = "spot_error", index = 4, match = "W8A8 sirf weights"},
        prompt = "Spot the error: \"W8A8 quantizes only the weights, so it is W4A16 at 8 bits.\"",
        choices = {
            "W8A8 quantizes activations too, so the matmul runs on INT8 units",
            "W8A8 quantizes only activations; the weights stay FP16 as in W4A16",
            "Nothing: W8A8 is weight-only; A8 is the accumulator's bit width",
            "W8A8 is an 8-bit KV cache; weights and activations stay in FP16",
        },
        answer = 1,
        explanation = "W8A8 quantizes the activations too, which lets the matmul run on INT8 units (a compute "
            .. "speed-up, useful in prefill). W4A16 keeps activations in FP16; it only reduces the bytes read "
            .. "from HBM.",
        hi_en = {
            prompt = "Galti pakdo: \"W8A8 sirf weights quantize karta hai, to yeh 8 bit wala W4A16 hai.\"",
            explanation = "W8A8 activations ko bhi quantize karta hai, isliye matmul seedha INT8 units par chalta "
                .. "hai (compute tez, prefill mein kaam ka). W4A16 activations FP16 mein rakhta hai; sirf HBM se "
                .. "padhe bytes kam karta hai.",
        },
    },
    {
        id = "se5", kind = "spot_error", topics = {"quantization"}, claim = "se5",
        seed = {section = "spot_error", index = 5, match = "Zero-point"},
        prompt = "Spot the error: \"The zero-point is z = round(r_min / s).\"",
        choices = {
            "Sign error: z = round(-r_min / s), the code that decodes back to 0.0",
            "It should use the top: z = round(r_max / s), the end of the code range",
            "It should multiply: z = round(r_min * s), so that z is in real units",
            "Nothing: with r_min < 0 a negative z is what moves codes into range",
        },
        answer = 1,
        explanation = "With r_min < 0, -r_min / s is positive and lands inside the code range [0, 2^b - 1]; it is "
            .. "the code q for which s (q - z) = 0. round(r_min / s) would be negative, outside the codes.",
        hi_en = {
            prompt = "Galti pakdo: \"Zero-point z = round(r_min / s) hai.\"",
            explanation = "r_min < 0 ho to -r_min / s positive hai aur codes [0, 2^b - 1] ke andar aata hai; yahi "
                .. "woh code hai jiske liye s (q - z) = 0. round(r_min / s) negative hoga, codes se bahar.",
        },
    },
    {
        id = "se6", kind = "spot_error", topics = {"quantization"}, claim = "se6",
        seed = {section = "spot_error", index = 6, match = "Per-tensor quantization per-channel"},
        prompt = "Spot the error: \"Per-tensor quantization is finer-grained than per-channel.\"",
        choices = {
            "Reversed: one (s, z) per tensor is coarser than one per channel",
            "Nothing: a tensor-wide range sees every value, so its step is finest",
            "They are equally fine: both keep one scale per row of the matrix",
            "Per-channel is coarser, since a channel mixes values of many layers",
        },
        answer = 1,
        explanation = "Per-tensor uses a single (s, z) for the whole matrix, the coarsest choice. Per-channel and "
            .. "per-group keep many scales, each fitted to fewer values, so the steps are smaller and the error lower.",
        hi_en = {
            prompt = "Galti pakdo: \"Per-tensor quantization per-channel se zyada fine hai.\"",
            explanation = "Ulta hai. Per-tensor poori matrix ke liye ek hi (s, z) leta hai, sabse mota. Per-channel "
                .. "aur per-group kai scales rakhte hain, har ek kam values par fit, to step chhota aur error kam.",
        },
    },
    {
        id = "se7", kind = "spot_error", topics = {"paged"}, claim = "se7",
        seed = {section = "spot_error", index = 7, match = "saara KV memory waste"},
        prompt = "Spot the error: \"PagedAttention eliminates all KV memory waste.\"",
        choices = {
            "Not all: a request's last block can leave block_size - 1 slots empty",
            "Nothing: blocks are cut to fit each request, so no slot is ever unused",
            "It wastes more than contiguous allocation: every block has a header",
            "It wastes one whole block per layer, kept free for copy-on-write",
        },
        answer = 1,
        explanation = "The last block of each request is usually only partly filled, so up to block_size - 1 slots "
            .. "per request stay unused. That is far less than reserving the maximum length up front, but not zero.",
        hi_en = {
            prompt = "Galti pakdo: \"PagedAttention KV memory ka saara waste khatam kar deta hai.\"",
            explanation = "Har request ka aakhri block aksar adha bhara hota hai, to block_size - 1 slots tak khaali "
                .. "reh sakte hain. Max length pehle se reserve karne se bahut kam, par zero nahi.",
        },
    },
    {
        id = "se8", kind = "spot_error", topics = {"paged"}, claim = "se8",
        seed = {section = "spot_error", index = 8, match = "Naive framework memory fragment"},
        prompt = "Spot the error: \"A naive serving framework fragments memory because attention is O(t^2).\"",
        choices = {
            "Wrong cause: each request reserves max_seq_len slots up front",
            "Nothing: the t x t attention matrix kept per request fragments it",
            "Wrong cause: tokenizer pieces of varying length fragment the memory",
            "Wrong cause: weights loaded layer by layer leave holes in memory",
        },
        answer = 1,
        explanation = "A naive server reserves one contiguous region of max_seq_len slots for each request before "
            .. "it knows the output length; the unused part is the waste. Attention's cost has nothing to do with it.",
        hi_en = {
            prompt = "Galti pakdo: \"Naive framework memory ko fragment karta hai kyunki attention O(t^2) hai.\"",
            explanation = "Naive server har request ke liye shuru mein hi max_seq_len ki lagaatar jagah reserve kar "
                .. "leta hai, output ki length jaane bina; bachi hui jagah waste hai. Attention ke cost se iska "
                .. "koi lena-dena nahi.",
        },
    },

    -- ---- Why ------------------------------------------------------------------------------
    {
        id = "why1", kind = "why", topics = {"roofline"}, claim = "why1",
        seed = {section = "why", index = 1, match = "Decode memory-bound kyun"},
        prompt = "Why is decode memory-bound while prefill is compute-bound?",
        answer = "Prefill pushes all prompt tokens through one big parallel matmul, so each weight read from memory "
            .. "feeds many multiply-adds (high arithmetic intensity, above the ridge point). Decode handles one "
            .. "token per sequence per step but still reads every weight and the KV cache, so there is little "
            .. "arithmetic per byte and bandwidth sets the pace.",
        explanation = "Compare FLOPs per byte read with the GPU's ridge point (peak FLOP/s divided by bandwidth).",
        hi_en = {
            prompt = "Decode memory-bound kyun hai aur prefill compute-bound kyun?",
            answer = "Prefill saare prompt tokens ek bade parallel matmul mein chalata hai, to har padha hua weight "
                .. "bahut saare multiply-add mein kaam aata hai (arithmetic intensity ridge point se upar). Decode "
                .. "har step mein har sequence ka ek token karta hai par saare weights aur KV cache phir bhi padhta "
                .. "hai; byte par arithmetic kam hai, to bandwidth raftaar tay karti hai.",
            explanation = "FLOPs per byte ko GPU ke ridge point (peak FLOP/s / bandwidth) se milao.",
        },
    },
    {
        id = "why2", kind = "why", topics = {"quantization", "roofline"}, claim = "why2",
        seed = {section = "why", index = 2, match = "INT4 tak reduce"},
        prompt = "Why do INT4 weights speed up decode even though the matmul still runs in FP16?",
        answer = "Decode is limited by reading the weights from HBM. INT4 codes are a quarter of the FP16 bytes "
            .. "(with a scale and zero-point per 64 weights, 0.547 bytes against 2: 3.7x fewer), and turning them "
            .. "back into FP16 inside the kernel is cheap next to the transfer it saves; arithmetic is not the limit.",
        explanation = "Time per decode step is about bytes read / bandwidth, and the weights are most of the bytes.",
        hi_en = {
            prompt = "Matmul abhi bhi FP16 mein chalta hai, phir bhi INT4 weights decode ko tez kyun karte hain?",
            answer = "Decode HBM se weights padhne se limited hai. INT4 codes FP16 ke chauthai bytes hain (har 64 "
                .. "weights par ek scale aur zero-point ke saath 0.547 bytes, 2 ke mukable: 3.7x kam), aur kernel ke "
                .. "andar unhe FP16 banana bache hue transfer ke saamne sasta hai; arithmetic rukawat nahi hai.",
            explanation = "Ek decode step ka time lagbhag bytes / bandwidth hai, aur zyada bytes weights ke hain.",
        },
    },
    {
        id = "why3", kind = "why", topics = {"quantization"}, claim = "why3",
        seed = {section = "why", index = 3, match = "rounding aur clipping dono"},
        prompt = "Why does quantization need both rounding and clipping, not just one of them?",
        answer = "Rounding maps an in-range value to the nearest level, which bounds its error by s/2. Clipping "
            .. "handles values outside the range: they saturate at the end codes instead of wrapping around or "
            .. "overflowing. Each covers a case the other cannot.",
        explanation = "In-range values: rounding error <= s/2. Out-of-range values: clipped to the nearest end.",
        hi_en = {
            prompt = "Quantization ko rounding aur clipping dono kyun chahiye, ek kaafi kyun nahi?",
            answer = "Rounding range ke andar ki value ko sabse paas ke level par le jaata hai, error s/2 tak "
                .. "simit. Clipping range ke bahar ki values sambhalta hai: woh wrap ya overflow hone ke bajaye "
                .. "kinaare ke code par ruk jaati hain. Dono alag case sambhalte hain.",
            explanation = "Andar ki values: error <= s/2. Bahar ki values: paas wale kinaare par clip.",
        },
    },
    {
        id = "why4", kind = "why", topics = {"quantization", "awq-gptq"}, claim = "why4",
        seed = {section = "why", index = 4, match = "group-wise scales"},
        prompt = "Why do 4-bit methods lean so heavily on group-wise scales and outlier handling?",
        answer = "With only 15 gaps the step is large. One outlier stretches a per-tensor range and makes the step "
            .. "bigger for every other weight, which then loses most of its precision. A scale per small group "
            .. "keeps the step tight where the values actually cluster, and outlier handling stops one value from "
            .. "setting the range for all.",
        explanation = "s = (r_max - r_min) / 15 at 4 bits: the range decides the step, and an outlier decides the range.",
        hi_en = {
            prompt = "4-bit methods group-wise scales aur outlier handling par itna kyun tikte hain?",
            answer = "Sirf 15 gaps hain to step bada hai. Ek outlier per-tensor range ko kheench deta hai aur baaki "
                .. "har weight ka step bada ho jaata hai, unki precision chali jaati hai. Chhote group ka apna scale "
                .. "step ko wahan tight rakhta hai jahan values sach mein hain, aur outlier handling ek value ko "
                .. "sabki range tay karne se rokta hai.",
            explanation = "4 bit par s = (r_max - r_min) / 15: range step tay karti hai, aur outlier range.",
        },
    },
    {
        id = "why5", kind = "why", topics = {"paged", "batching"}, claim = "why5",
        seed = {section = "why", index = 5, match = "throughput ~24"},
        prompt = "Why can PagedAttention raise throughput yet leave a single request's latency as it is?",
        answer = "It packs more requests into the same HBM (less waste, so a bigger batch, so more useful work per "
            .. "weight read). One request's own path is unchanged: the same math, one token per step.",
        explanation = "Throughput belongs to the batch, latency to one request's steps. The bank's ~24x is not "
            .. "paging alone: it set vLLM (paging and continuous batching) against HF Transformers (neither).",
        hi_en = {
            prompt = "PagedAttention throughput badha sakta hai, par ek request ki latency kyun nahi badalti?",
            answer = "Yeh same HBM mein zyada requests bhar deta hai (kam waste, bada batch, har weight read par zyada "
                .. "kaam). Ek request ka apna raasta wahi rehta hai: same math, har step ek token.",
            explanation = "Throughput batch ki baat hai, latency ek request ke steps ki. Bank ka ~24x akele paging "
                .. "ka nahi: woh vLLM (paging + continuous batching) ko HF Transformers (dono nahi) se milata hai.",
        },
    },
    {
        id = "why6", kind = "why", topics = {"parallelism", "roofline"}, claim = "why6",
        seed = {section = "why", index = 6, match = "Tensor parallelism"},
        prompt = "Why does tensor parallelism not remove decode's memory-bound nature?",
        answer = "Sharding splits the weights and the KV cache across GPUs so that bigger models fit, but every GPU "
            .. "still streams its own shard from HBM at every step, and the GPUs must also exchange activations. "
            .. "The per-step bottleneck stays bandwidth (plus communication).",
        explanation = "Each GPU reads 1/N of the layer weights and does 1/N of their FLOPs: the ratio, and so the "
            .. "bound, is unchanged.",
        hi_en = {
            prompt = "Tensor parallelism decode ko memory-bound hone se kyun nahi bachata?",
            answer = "Sharding weights aur KV cache ko GPUs mein baant deta hai taaki bade models fit hon, par har GPU "
                .. "har step apna hissa HBM se padhta hi hai, upar se GPUs ko activations aapas mein bhejne padte "
                .. "hain. Har step ki rukawat bandwidth (plus communication) hi rehti hai.",
            explanation = "Har GPU layer weights ka 1/N padhta hai aur unke FLOPs ka 1/N karta hai: ratio wahi, to "
                .. "bound bhi wahi.",
        },
    },

    -- ---- Edge cases -------------------------------------------------------------------------
    {
        id = "edge1", kind = "edge", topics = {"paged"}, claim = "edge1",
        seed = {section = "edge", index = 1, match = "exact multiple"},
        prompt = "What is the KV waste of a request whose length is an exact multiple of block_size?",
        choices = {
            "None: every block, the last one included, is full",
            "block_size - 1 slots, the worst case for any tail",
            "One whole block, kept free for the next new token",
            "Half a block, the average over all request lengths",
        },
        answer = 1,
        explanation = "Every block, the last one included, is completely filled: the best case for paged KV.",
        hi_en = {
            prompt = "Jis request ki length block_size ka poora multiple ho, uska KV waste kitna hai?",
            explanation = "Har block, aakhri bhi, poora bhara hai: paged KV ka sabse achha case.",
        },
    },
    {
        id = "edge2", kind = "edge", topics = {"quantization"}, claim = "edge2",
        seed = {section = "edge", index = 2, match = "halfway"},
        prompt = "What is the quantization error of a weight that lies exactly halfway between two levels?",
        choices = {
            "s / 2, the largest error rounding can make",
            "Zero, since a tie rounds to the even level",
            "s, since a tie always rounds up a whole step",
            "s / 4, the mean of the two possible errors",
        },
        answer = 1,
        explanation = "Rounding has to pick one side, and either side is half a step away: s/2 is the worst case "
            .. "for an in-range value.",
        hi_en = {
            prompt = "Jo weight do levels ke theek beech mein ho, uska quantization error kitna hai?",
            explanation = "Rounding ko ek taraf jaana hi hai, aur dono taraf aadha step door hain: s/2, range ke andar "
                .. "ki value ka sabse bura case.",
        },
    },
    {
        id = "edge3", kind = "edge", topics = {"quantization"}, claim = "edge3",
        seed = {section = "edge", index = 3, match = "far upar"},
        prompt = "Asymmetric b-bit quantization: what comes out for a real value far above r_max?",
        choices = {
            "It clips to the top code 2^b - 1, which decodes to about r_max",
            "It wraps around to a small code, the way integer overflow does",
            "It overflows past 2^b - 1 and decodes to infinity or to NaN",
            "The scale s is recomputed on the spot so that the range includes it",
        },
        answer = 1,
        explanation = "The code saturates at 2^b - 1 and r_hat = s (2^b - 1 - z), which is r_max (to within half a "
            .. "step when z was rounded). The outlier is clipped, not overflowed.",
        hi_en = {
            prompt = "Asymmetric b-bit: r_max se bahut upar ki value ka kya hota hai?",
            explanation = "Code 2^b - 1 par ruk jaata hai aur r_hat = s (2^b - 1 - z), yaani lagbhag r_max. Outlier "
                .. "clip hota hai, overflow nahi.",
        },
    },
    {
        id = "edge4", kind = "edge", topics = {"quantization"}, claim = "edge4",
        seed = {section = "edge", index = 4, match = "far neeche"},
        prompt = "Asymmetric b-bit quantization: what comes out for a real value far below r_min?",
        choices = {
            "It clips to code 0, which decodes to s (0 - z), about r_min",
            "It wraps around to the top code 2^b - 1, which is near r_max",
            "It turns into NaN, since there is no code below 0 to use",
            "It decodes to exactly 0.0, the value the zero-point z stands for",
        },
        answer = 1,
        explanation = "The code saturates at 0 and r_hat = s (0 - z) = -s z, which is r_min (to within half a step): "
            .. "the mirror image of clipping at the top.",
        hi_en = {
            prompt = "Asymmetric b-bit: r_min se bahut neeche ki value ka kya hota hai?",
            explanation = "Code 0 par ruk jaata hai aur r_hat = s (0 - z), lagbhag r_min: upar wale clip ka ulta roop.",
        },
    },
    {
        id = "edge5", kind = "edge", topics = {"paged", "batching"}, claim = "edge5",
        seed = {section = "edge", index = 5, match = "Batch size 1"},
        prompt = "With batch size 1 and a short prompt, does PagedAttention help throughput?",
        choices = {
            "Barely: no other request is waiting for the memory paging frees",
            "Yes, about 24x, the serving gain the vLLM paper reports for it",
            "Yes: the block-wise kernel needs fewer FLOPs for each new token",
            "No: looking up the block table makes the request several times slower",
        },
        answer = 1,
        explanation = "Paged KV wins by fitting more requests into memory. A lone request still wastes most of a "
            .. "contiguous reservation (lesson 04 measures 87% wasted against 14.7% paged), but at batch 1 nothing "
            .. "else is waiting for that memory, so freeing it buys no extra throughput.",
        hi_en = {
            prompt = "Batch size 1 aur chhota prompt: kya PagedAttention throughput badhata hai?",
            explanation = "Paged KV ka fayda zyada requests memory mein bharne se aata hai. Akeli request "
                .. "contiguous reservation ka zyada hissa ab bhi bekaar chhodti hai (lesson 04: 87% vs paged 14.7%), "
                .. "par batch 1 par us memory ka intezaar koi aur request nahi kar rahi, to use khaali karke "
                .. "throughput nahi badhta.",
        },
    },
    {
        id = "edge6", kind = "edge", topics = {"paged"}, claim = "edge6",
        seed = {section = "edge", index = 6, match = "shared block mein naya token"},
        prompt = "Two requests share a prefix. Both try to write a new token into the same shared block. What happens?",
        choices = {
            "Copy-on-write: the writer first gets its own copy of the block",
            "The second request waits until the first one has finished",
            "Both write into the shared block and corrupt each other's KV",
            "The shared prefix is recomputed from scratch for both of the requests",
        },
        answer = 1,
        explanation = "A block with more than one owner is never written in place: the writer gets a private copy "
            .. "first, which keeps the requests isolated.",
        hi_en = {
            prompt = "Do requests ek prefix share karti hain. Dono shared block mein naya token likhna chahti hain. "
                .. "Kya hota hai?",
            explanation = "Ek se zyada owner wale block mein seedha nahi likha jaata: likhne wale ko pehle apni copy "
                .. "milti hai, requests alag rehti hain.",
        },
    },
    {
        id = "edge7", kind = "edge", topics = {"paged"}, claim = "edge7",
        seed = {section = "edge", index = 7, match = "block_size = 1"},
        prompt = "With block_size = 1, what have you effectively built?",
        choices = {
            "Per-token allocation: no tail waste, but the largest block tables",
            "The contiguous allocator again: each request's slots in one run",
            "The best setting for every workload, with no waste of any kind",
            "An engine that cannot run: attention needs whole heads per block",
        },
        answer = 1,
        explanation = "One slot per block removes tail waste entirely, at the cost of one table entry per token and "
            .. "an attention kernel that gathers one token at a time: the opposite extreme from huge blocks.",
        hi_en = {
            prompt = "block_size = 1 rakha to asal mein kya bana?",
            explanation = "Har block mein ek slot: tail waste zero, par har token ki ek table entry aur attention "
                .. "kernel ek-ek token utha ta hai. Bade block ka bilkul ulta chhor.",
        },
    },
    {
        id = "edge8", kind = "edge", topics = {"kv-sizing"}, claim = "edge8",
        seed = {section = "edge", index = 8, match = "pehle decode step"},
        prompt = "What is the KV cache size at the very first decode step, when S = 1?",
        choices = {
            "2 * B * L * d_model * p (n_kv_heads * d_head for d_model with GQA)",
            "Zero: nothing is cached until the first new token is written back",
            "2 * B * L * d_model^2 * p: a d_model x d_model matrix per layer",
            "The whole max_seq_len reservation, which is made before the first step",
        },
        answer = 1,
        explanation = "Put S = 1 into 2 * B * S * L * kv_dim * p: kv_dim = d_model with multi-head attention "
            .. "(Llama-2-7B, B = 1, FP16: 512 KiB), n_kv_heads * d_head with GQA (Llama-2-70B: 8 * 128 = 1024, "
            .. "320 KiB, not 2560). The cache then grows by that much with every token.",
        hi_en = {
            prompt = "Bilkul pehle decode step par (S = 1) KV cache kitna bada hai?",
            explanation = "2 * B * S * L * kv_dim * p mein S = 1 rakho: multi-head attention mein kv_dim = d_model "
                .. "(Llama-2-7B, B = 1, FP16: 512 KiB), GQA mein n_kv_heads * d_head (Llama-2-70B: 8 * 128 = 1024, "
                .. "320 KiB, 2560 nahi). Phir har token ke saath cache utna hi badhta hai.",
        },
    },

    -- ---- Recall -------------------------------------------------------------------------------
    {
        id = "recall1", kind = "recall", topics = {"quantization", "roofline"}, claim = "recall1",
        seed = {section = "recall", index = 1, match = "prefill par risk"},
        prompt = "In one sentence: why does quantization win on decode but risk losing on prefill?",
        answer = "Decode is memory-bound, so fewer weight bytes means faster steps; prefill is compute-bound, so "
            .. "the extra dequantization work can outweigh the smaller read.",
        explanation = "Which resource limits the phase decides whether fewer bytes help.",
        hi_en = {
            prompt = "Ek line mein: quantization decode par kyun jeetta hai aur prefill par risk kyun hai?",
            answer = "Decode memory-bound hai, to kam weight bytes matlab tez steps; prefill compute-bound hai, to "
                .. "dequant ka extra kaam chhote read ke fayde se bhaari pad sakta hai.",
            explanation = "Phase ko kaunsa resource rokta hai, wahi tay karta hai ki kam bytes madad karenge ya nahi.",
        },
    },

    -- ---- Beyond the bank: the lab's own claims, measured by the lessons like the others --------
    {
        id = "w4a8-prefill", kind = "true_false", topics = {"quantization", "roofline"}, claim = "w4a8-prefill",
        beyond_bank = true,
        prompt = "If the activations are quantized to 8 bits as well (W4A8, integer dot products), 4-bit weights "
            .. "make prefill faster.",
        answer = true,
        explanation = "Prefill is limited by arithmetic: what counts is the multiply-adds per instruction. W4A8 "
            .. "quantizes each activation row once per matmul (int8, a scale per 32 values) and multiplies 4-bit by "
            .. "8-bit integers directly: 64 per AVX-512 VNNI instruction, against 16 for fp16 widened to fp32. Lesson "
            .. "06 times W4A8 at about x0.8 of fp16; with AVX-512 BF16, W4A16 at group 32 (32 per instruction) comes "
            .. "close, the default W4A16 (group 64) is slower than fp16.",
        hi_en = {
            prompt = "Agar activations bhi 8 bit mein quantize hon (W4A8, integer dot products), to 4-bit weights "
                .. "prefill ko fast karte hain.",
            explanation = "Prefill arithmetic se limited hai: dekhna hai ki ek instruction kitne multiply-adds "
                .. "karti hai. W4A8 har activation row ko matmul mein ek baar int8 banata hai (har 32 values par scale) "
                .. "aur 4-bit x 8-bit integers seedha multiply karta hai: AVX-512 VNNI mein 64 per instruction, fp16 "
                .. "ko fp32 banake sirf 16. Lesson 06 mein W4A8 fp16 ka lagbhag x0.8 hai; AVX-512 BF16 par group 32 "
                .. "wala W4A16 (32 per instruction) paas aata hai, default W4A16 (group 64) fp16 se slow hai.",
        },
    },
}
