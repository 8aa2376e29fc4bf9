-- hostile: a __len of 2^62 once wrapped m:decode's buffer size to 0 (heap overwrite); arrays are read raw now, so the __len is never consulted
-- expect: decoded 0 bytes
lab.lesson{title = "hostile", claims = {"h1"}}
local m = lab.model{model = "tiny"}
local text = m:decode(setmetatable({}, {__len = function() return 1 << 62 end, __index = function() return 65 end}))
error("decoded " .. #text .. " bytes", 0)
