-- hostile: ids = {1e30} was once reported as token -2147483648
-- expect: element 1: expected a token id (an integer), got 1e+30
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny"}
e:add{ids = {1e30}}
