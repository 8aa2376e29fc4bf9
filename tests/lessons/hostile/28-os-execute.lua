-- hostile: running a shell command
-- expect: os.execute is not available to lessons
lab.lesson{title = "hostile", claims = {"h1"}}
os.execute("touch ../outside/pwned")
