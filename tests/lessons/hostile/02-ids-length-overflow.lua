-- hostile: the same __len trick on e:add{ids=...} (read raw now: the array is empty)
-- expect: expected 1..1048576 token ids, got 0
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny"}
e:add{ids = setmetatable({}, {__len = function() return 1 << 40 end, __index = function() return 5 end})}
