-- hostile: a looping finalizer placed before lab.lesson{} once hung 'lesson list' and 'lesson check'
-- command: check
-- expect: __gc finalizers are not available to lessons
setmetatable({}, {__gc = function() while true do end end})
lab.lesson{title = "hostile", claims = {"h1"}}
