-- hostile: a measure() function that never returns
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
lab.check{id = "h1", claim = "c", expected = true, measure = function() while true do end end}
