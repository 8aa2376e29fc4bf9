-- hostile: e:sequence(2^53) once reported 'no sequence 0'
-- expect: no sequence 9007199254740992
lab.lesson{title = "hostile", claims = {"h1"}}
local e = lab.engine{model = "tiny"}
e:sequence(2^53)
