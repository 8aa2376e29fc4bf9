-- hostile: encoding a 640 KB prompt once took minutes (quadratic BPE) inside one C call the time limit cannot stop
-- (a 20 s limit: the sanitizer build needs more than 1 s for the model and the text; the old encoder needed minutes)
-- setup: copy-shared tok512.bin
-- setup: copy-shared stories260K.bin
-- expect: PASS h1
-- expect-status: 0
-- time-limit: 20
-- max-cpu-seconds: 10
lab.lesson{title = "hostile", claims = {"h1"}}
local m = lab.model{model = "stories260K.bin", tokenizer = "tok512.bin"}
local text = string.rep("Once upon a time, a little girl named Lily saw a big dog. ", 11000)
local ids = m:encode(text)
lab.check{id = "h1", claim = "a 640 KB prompt encodes", expected = true, verdict = #ids > 1000,
          evidence = #text .. " bytes, " .. #ids .. " tokens"}
