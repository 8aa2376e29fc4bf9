-- hostile: thousands of small files in the output folder, closed one by one
-- expect: write quota of 256 files reached (--write-files)
lab.lesson{title = "hostile", claims = {"h1"}}
for i = 1, 2000 do
  local f = io.open("f" .. i .. ".txt", "w")
  f:write("x")
  f:close()
end
