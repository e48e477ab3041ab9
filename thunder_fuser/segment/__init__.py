from thunder_fuser.segment.schedule import Schedule, schedule_segments
from thunder_fuser.segment.segmenter import Segment, segment_region

__all__ = ["Schedule", "Segment", "schedule_segments", "segment_region"]
