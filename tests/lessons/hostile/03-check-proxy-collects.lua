-- hostile: an __index proxy that collects garbage once freed the id lab.check still used
-- expect: field 'id': expected the claim id as a string
lab.lesson{title = "hostile", claims = {"h1"}}
lab.check(setmetatable({}, {__index = function(_, key)
    collectgarbage()
    if key == "id" then return "h" .. tostring(1) end
    if key == "expected" then return true end
    return "x" .. tostring(math.random())
end}))
