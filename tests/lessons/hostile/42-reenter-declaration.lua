-- hostile: lab.lesson{} re-entered from an __index on its own claims (wrote past the 64 places)
-- expect: bad argument #1 to 'lesson' (field 'claims': expected 1..64 claim ids, got 0)
local claims = setmetatable({}, {__len = function() return 64 end,
  __index = function(t, i)
    local ids = {}
    for k = 1, 64 do ids[k] = "b" .. k end
    lab.lesson{title = "inner", claims = ids}
    return "c" .. i
  end})
lab.lesson{title = "outer", claims = claims}
