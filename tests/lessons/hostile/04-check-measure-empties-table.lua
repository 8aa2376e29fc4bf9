-- hostile: measure() empties the argument table and collects before the host reports the id
-- expect: PASS h1 "a claim 2": TRUE, as the lesson expects
-- expect-status: 0
lab.lesson{title = "hostile", claims = {"h1"}}
local t
t = {id = "h" .. tostring(1), claim = "a claim " .. tostring(2), expected = true, measure = function()
    t.id, t.claim = nil, nil
    collectgarbage(); collectgarbage()
    return true, "measured"
end}
lab.check(t)
