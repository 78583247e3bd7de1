"""The models: the cross-encoder (:mod:`.cross_encoder`) and the embedders (:mod:`.embedders`)."""
