"""A policy driving the follower: loading, its own process, action chunks, refusals, takeover."""
