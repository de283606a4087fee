"""Videos measured from their containers' headers, never decoding a frame (issue: video and audio
inside conversations)."""
