-- hostile: exhausting the host's file descriptors
-- expect: a lesson may keep at most 32 files open
lab.lesson{title = "hostile", claims = {"h1"}}
local kept = {}
for i = 1, 100 do kept[i] = io.open("f" .. i .. ".txt", "w") end
