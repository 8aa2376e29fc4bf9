-- hostile: swap a step record's strict metatable for one whose __index forges fields
-- expect: cannot change a protected metatable
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny", num_blocks = 16}
e:add{prompt = "x", max_tokens = 2}
local r = e:step()
assert(type(getmetatable(r)) == "string", "the record's metatable is hidden")
setmetatable(r, {__index = function() return 1e18 end})
lab.say("swapped: " .. r.anything)
