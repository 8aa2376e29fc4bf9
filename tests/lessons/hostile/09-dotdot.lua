-- hostile: climbing out with '..', for reading and for writing
-- expect: '../outside/sentinel' is outside the lesson's folder
-- expect: 'sub/../../x' is outside the output folder
lab.lesson{title = "hostile", claims = {"h1"}}
print(pcall(io.open, "../outside/sentinel"))
io.open("sub/../../x", "w")
