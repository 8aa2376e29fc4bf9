-- hostile: a finalizer that loops would run with hooks off (at collection and at close)
-- expect: __gc finalizers are not available to lessons
lab.lesson{title = "hostile", claims = {"h1"}}
setmetatable({}, {__gc = function() while true do end end})
