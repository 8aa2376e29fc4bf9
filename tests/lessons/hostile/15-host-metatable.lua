-- hostile: replacing the engine's own __gc (hooks off at close, and the engine never freed)
-- expect: attempt to index a string value
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny"}
getmetatable(e).__gc = function() while true do end end
