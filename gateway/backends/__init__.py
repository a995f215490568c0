"""The gateway's clients of the draft and verifier services: replicas, streams, deadlines, and the
reporter of finished generations to the draft tier."""
