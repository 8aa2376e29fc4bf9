-- hostile: an absolute path outside the lesson's folder
-- expect: '/etc/passwd' is outside the lesson's folder
lab.lesson{title = "hostile", claims = {"h1"}}
io.open("/etc/passwd")
