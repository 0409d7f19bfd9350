"""What the benchmark suites share: measurement and alternation, the inputs they run on, the recipe and steps
both sides train with, official YOLOX's side. It imports no suite."""
