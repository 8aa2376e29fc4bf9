-- hostile: filling the disk through the output folder (512 MiB in 2.7 s before the quota)
-- expect: write quota of 64.0 MiB reached (--write-limit)
lab.lesson{title = "hostile", claims = {"h1"}}
local chunk = string.rep("x", 1 << 20)
local f = io.open("big.txt", "w")
for i = 1, 100 do f:write(chunk) end
f:close()
