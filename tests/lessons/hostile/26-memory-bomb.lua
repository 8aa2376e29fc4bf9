-- hostile: a gigabyte string against the 512 MiB cap
-- expect: memory limit of 512 MiB reached
lab.lesson{title = "hostile", claims = {"h1"}}
local s = string.rep("x", 1 << 30)
