-- hostile: a loop inside a coroutine
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
coroutine.wrap(function() while true do end end)()
