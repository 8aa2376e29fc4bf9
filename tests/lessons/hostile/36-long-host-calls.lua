-- hostile: a lesson made of long host calls (each lab.model("small") is ~0.5 s of C the hook never sees) once ran 6.4 s of CPU under a 1 s limit
-- expect: time limit of 1 s CPU exceeded
lab.lesson{title = "hostile", claims = {"h1"}}
local m0 = lab.model("small")
local m1 = lab.model("small")
local m2 = lab.model("small")
local m3 = lab.model("small")
local m4 = lab.model("small")
local m5 = lab.model("small")
local m6 = lab.model("small")
local m7 = lab.model("small")
local m8 = lab.model("small")
local m9 = lab.model("small")
local m10 = lab.model("small")
local m11 = lab.model("small")
