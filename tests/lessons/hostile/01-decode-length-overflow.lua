-- hostile: a __len of 2^62 once wrapped m:decode's buffer size to 0 (heap overwrite)
-- expect: expected 0..1048576 token ids, got 4611686018427387904
lab.lesson{title = "hostile", claims = {"h1"}}
local m = lab.model{model = "tiny"}
m:decode(setmetatable({}, {__len = function() return 1 << 62 end, __index = function() return 65 end}))
