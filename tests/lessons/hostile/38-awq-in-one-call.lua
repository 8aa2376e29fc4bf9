-- hostile: one lab.quantize_model(small, AWQ) is ~5 s of C; twenty of them once ran 112 s of CPU under a 1 s limit
-- (it now stops after the layer in progress: up to ~5 s of CPU under the sanitizers)
-- expect: time limit of 1 s CPU exceeded
-- max-cpu-seconds: 12
lab.lesson{title = "hostile", claims = {"h1"}}
local m = lab.model("small")
for i = 1, 20 do local q = lab.quantize_model(m, "w4a16:g32:awq") end
