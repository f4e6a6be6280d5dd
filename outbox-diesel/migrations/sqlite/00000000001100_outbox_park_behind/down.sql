-- Parked messages are promoted by the worker as their keys move on: nothing to undo.
SELECT 1;
