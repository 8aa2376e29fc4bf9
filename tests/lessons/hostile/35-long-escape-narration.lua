-- hostile: a megabyte of ESC bytes as narration
-- expect: ^[^[^[^[
lab.lesson{title = "hostile", claims = {"h1"}}
print(string.rep("\27", 1 << 20))
error("done", 0)
