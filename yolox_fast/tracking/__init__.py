"""Tracking detections across video frames: ByteTrack's association (`ByteTracker`), a plain IoU tracker
baseline (`IoUTracker`), and the MOT Challenge text format their tracks are written in."""

from yolox_fast.tracking.bytetrack import ByteTracker, ByteTrackSettings
from yolox_fast.tracking.iou_tracker import IoUTracker
from yolox_fast.tracking.mot import mot_lines, read_mot

__all__ = ["ByteTrackSettings", "ByteTracker", "IoUTracker", "mot_lines", "read_mot"]
