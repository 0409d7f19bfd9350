"""ByteTrack's association (Zhang et al., ECCV 2022): every detection box is used, the low-score ones too.

Each frame, every track's box is predicted by its Kalman filter (`kalman.BoxKalmanFilter`), then:

1. high-score detections (score >= `high`) are matched to the tracked and the recently lost tracks
   (cost 1 - IoU x score, gate `match_cost`);
2. low-score detections (`low` <= score < `high`: mostly occluded or blurred objects) are matched to the
   tracked ones left (cost 1 - IoU, gate `low_match_cost`); tracked ones still unmatched become lost;
3. tracks born last frame (unconfirmed) are matched to the high-score detections left (gate
   `unconfirmed_match_cost`); those unmatched are dropped, a single-frame false positive;
4. high-score detections left that score >= `new_track` start tracks;
5. tracks lost for more than `max_lost` frames are removed; until then a returning object gets its id back.

Matching is a minimum-cost assignment (scipy's `linear_sum_assignment`) over all classes; a track takes the
class of its latest box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from yolox_fast.tracking.association import iou_cost, match
from yolox_fast.tracking.kalman import BoxKalmanFilter


@dataclass(frozen=True)
class ByteTrackSettings:
    """ByteTrack's thresholds (its MOT17 defaults; `new_track` = `high` + 0.1 as in its code)."""

    high: float = 0.5
    low: float = 0.1
    new_track: float = 0.6
    match_cost: float = 0.8
    low_match_cost: float = 0.5
    unconfirmed_match_cost: float = 0.7
    max_lost: int = 30  # frames (ByteTrack's track_buffer at 30 fps)


class _Track:
    """One object: its filter, id, class, last score, whether confirmed and the last frame it was seen."""

    def __init__(self, box: np.ndarray, score: float, cls: int, track_id: int, frame: int, confirmed: bool):
        self.filter = BoxKalmanFilter(box)
        self.score = score
        self.cls = cls
        self.id = track_id
        self.last_seen = frame
        self.confirmed = confirmed
        self.lost = False

    def see(self, box: np.ndarray, score: float, cls: int, frame: int) -> None:
        self.filter.update(box)
        self.score = score
        self.cls = cls
        self.last_seen = frame
        self.confirmed = True
        self.lost = False


class ByteTracker:
    """Tracks over consecutive frames of one video: `update` once per frame, in order."""

    def __init__(self, settings: ByteTrackSettings | None = None) -> None:
        self.settings = settings or ByteTrackSettings()
        self.frame = 0
        self.tracks: list[_Track] = []  # tracked, lost and unconfirmed alike
        self._next_id = 1

    def update(self, detections: np.ndarray) -> np.ndarray:
        """Take one frame's detections (K, 6) [x1, y1, x2, y2, score, class] (boxes in pixels) and return the
        tracks seen in it, (T, 7) [x1, y1, x2, y2, track id, score, class], boxes the filtered state."""
        s = self.settings
        self.frame += 1
        dets = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        dets = dets[dets[:, 4] >= s.low]
        high, low = dets[dets[:, 4] >= s.high], dets[dets[:, 4] < s.high]
        for track in self.tracks:
            track.filter.predict(keep_height_velocity=not track.lost)

        confirmed = [t for t in self.tracks if t.confirmed]
        unconfirmed = [t for t in self.tracks if not t.confirmed]
        # 1. high-score boxes to tracked and lost tracks, IoU weighted by the detection's score
        pairs, left_tracks, left_high = match(self._cost(confirmed, high, True), s.match_cost)
        self._see(confirmed, high, pairs)
        # 2. low-score boxes to the tracked ones left (a lost track needs a confident box to come back)
        remaining = [confirmed[i] for i in left_tracks if not confirmed[i].lost]
        pairs, unmatched, _ = match(self._cost(remaining, low, False), s.low_match_cost)
        self._see(remaining, low, pairs)
        for i in unmatched:
            remaining[i].lost = True
        # 3. last frame's newborns to the high-score boxes left
        high = high[left_high]
        pairs, dropped, left_high = match(self._cost(unconfirmed, high, True), s.unconfirmed_match_cost)
        self._see(unconfirmed, high, pairs)
        gone = {id(unconfirmed[i]) for i in dropped}
        # 4. new tracks; 5. forget the long lost
        for det in high[left_high]:
            if det[4] >= s.new_track:
                # on the first frame there is no earlier frame to confirm against: tracks start confirmed
                track = _Track(det[:4], det[4], int(det[5]), self._next_id, self.frame, self.frame == 1)
                self.tracks.append(track)
                self._next_id += 1
        self.tracks = [t for t in self.tracks if id(t) not in gone and self.frame - t.last_seen <= s.max_lost]
        seen = [t for t in self.tracks if t.confirmed and t.last_seen == self.frame]
        if not seen:
            return np.zeros((0, 7))
        return np.array([[*t.filter.box, t.id, t.score, t.cls] for t in seen])

    def _see(self, tracks: list[_Track], dets: np.ndarray, pairs: list[tuple[int, int]]) -> None:
        for ti, di in pairs:
            tracks[ti].see(dets[di, :4], float(dets[di, 4]), int(dets[di, 5]), self.frame)

    @staticmethod
    def _cost(tracks: list[_Track], dets: np.ndarray, by_score: bool) -> np.ndarray:
        """(T, D) 1 - IoU of the tracks' predicted boxes with `dets`; `by_score`: 1 - IoU x score, so that
        of two equal overlaps the surer box wins (ByteTrack's score fusion)."""
        boxes = np.stack([t.filter.box for t in tracks]) if tracks else np.zeros((0, 4))
        cost = iou_cost(boxes, dets[:, :4])
        return 1.0 - (1.0 - cost) * dets[None, :, 4] if by_score else cost
