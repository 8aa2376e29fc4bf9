-- hostile: lab.quantize's model handed back by an __index (collected under the tensor's copy)
-- expect: tensor needs the model it belongs to
lab.lesson{title = "hostile", claims = {"h1"}}
collectgarbage("incremental", 1, 1000)
lab.quantize(setmetatable({tensor = "layers.0.w1", bits = 4}, {__index = function(t, k)
  if k == "model" then return lab.model("tiny") end
end}))
