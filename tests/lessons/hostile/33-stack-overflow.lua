-- hostile: unbounded recursion
-- expect: stack overflow
lab.lesson{title = "hostile", claims = {"h1"}}
local function f() return 1 + f() end
f()
